//! Tests of the cluster settings of `Config` (spec cluster.md §7.11).

use super::*;

fn parse(text: &str) -> Config {
    let mut c: Config = toml::from_str(text).expect("parse");
    c.resolve_sections();
    c
}

const PEERS: &str = "[[raft.peers]]\nnode_id = 1\nurl = \"http://127.0.0.1:4437\"\n\
    [[raft.peers]]\nnode_id = 2\nurl = \"http://127.0.0.1:4447\"\n\
    [[raft.peers]]\nnode_id = 3\nurl = \"http://127.0.0.1:4457\"\n";

#[test]
fn cluster_keys_and_start_up_errors() {
    let shared = "[storage.cold]\nbackend = \"local\"\n[storage.cold.local]\npath = \"/tmp/c\"\nshared = true\n";
    let c = parse(&format!(
        "[server]\nlisten = \"127.0.0.1:4447\"\ncluster_id = \"c1\"\n\
         [raft]\nnode_id = 2\ngroup_count = 8\ninit_membership_per_group = true\n{PEERS}{shared}"
    ));
    c.validate().expect("valid");
    assert_eq!(c.listen.port(), 4447);
    assert_eq!(c.group_count, Some(8));
    assert_eq!(c.node_id(), 2);
    assert!(c.has_peers() && c.init_membership());
    assert_eq!(c.peer_urls()[&3], "http://127.0.0.1:4457");

    let err = |text: String| parse(&text).validate().expect_err(&text).to_string();
    assert!(err(format!("[raft]\nnode_id = 4\n{PEERS}{shared}")).contains("not one of"));
    assert!(err(format!("[raft]\n{PEERS}{shared}")).contains("required"));
    assert!(err("[raft]\nnode_id = 0\n".into()).contains("non-zero"));
    let dup = PEERS.replace("node_id = 3", "node_id = 2");
    assert!(err(format!("[raft]\nnode_id = 1\n{dup}{shared}")).contains("twice"));
    let bad_url = PEERS.replace("http://127.0.0.1:4457", "127.0.0.1:4457");
    assert!(err(format!("[raft]\nnode_id = 1\n{bad_url}{shared}")).contains("url"));
    // A multi-node cluster needs a shared cold store.
    assert!(err(format!("[raft]\nnode_id = 1\n{PEERS}")).contains("storage.cold"));
    for backend in ["memory", "none"] {
        let cold = format!("[storage.cold]\nbackend = \"{backend}\"\n");
        let _ = err(format!("[raft]\nnode_id = 1\n{PEERS}{cold}"));
    }
    // Timing and governance keys.
    let c = parse(&format!(
        "[raft]\nnode_id = 1\nheartbeat_interval = \"100ms\"\nelection_timeout_min = \"400ms\"\n\
         election_timeout_max = \"800ms\"\n{PEERS}{shared}\
         [governance.leadership_balance]\ninterval = \"2s\"\nmax_per_tick = 1\n"
    ));
    c.validate().expect("valid");
    assert_eq!(
        c.raft.timing(),
        ursula_raft::RaftTiming {
            heartbeat_ms: 100,
            election_min_ms: 400,
            election_max_ms: 800
        }
    );
    assert_eq!(c.governance.leadership_balance.interval.as_secs(), 2);
    assert_eq!(c.governance.leadership_balance.max_per_tick, 1);
    assert_eq!(
        Config::default().raft.timing(),
        ursula_raft::RaftTiming::default()
    );
    assert!(err("[raft]\nheartbeat_interval = \"200ms\"\n".into()).contains("heartbeat_interval"));
    assert!(toml::from_str::<Config>("[governance]\nbogus = 1\n").is_err());
    // The spec's [raft.wal] and [runtime] core_count keys.
    let c =
        parse("[runtime]\ncore_count = 2\n[raft.wal]\nbackend = \"disk\"\npath = \"/var/lib/u\"\n");
    c.validate().expect("valid");
    assert_eq!(c.data_dir, PathBuf::from("/var/lib/u"));
    assert_eq!(c.runtime.core_count, Some(2));
    assert!(err("[raft.wal]\nbackend = \"memory\"\n".into()).contains("not supported"));
    assert!(err("[raft.wal]\nbackend = \"tape\"\n".into()).contains("disk"));
    assert!(err("[runtime]\ncore_count = 0\n".into()).contains("core_count"));
    let unshared = "[storage.cold]\nbackend = \"local\"\n";
    assert!(err(format!("[raft]\nnode_id = 1\n{PEERS}{unshared}")).contains("shared"));
}
