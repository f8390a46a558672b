//! Node replacement (cluster.md §5.3): a node whose data directory was wiped takes no part in
//! a group until the group's leader allows it, and helps elect no one until it has caught up.
//!
//! A node opening a directory without `node.toml` and without a log, with peers and without
//! `init_membership`, was wiped (or is new to a running cluster): it forgot its votes and its
//! log, so letting it vote could elect a leader that misses acknowledged writes, or let it vote
//! twice in one term. Every group starts **awaiting permission**: every Raft RPC of the group
//! (append, vote, snapshot, anything else but a propose and the permission itself) is refused
//! with an error, which the sender's transport treats as a failed send and retries, and the
//! group never campaigns. A transfer's elect (kind 5) gets a refusal in its own answer
//! format, so the transferring leader moves on at once. Kinds are let through by a list, so
//! a kind added later is refused to a marked group until it is listed here.
//!
//! `POST /__ursula/raft/{group}/nodes/{node}/allow-next-revert` on the group's leader sends
//! the node a one-shot permission (wire kind 6) carrying the leader's commit index. The group
//! is then **rehydrating**: it accepts the leader's entries and snapshot (openraft's
//! `loosen-follower-log-revert` lets the leader restart replication to a follower whose log
//! went backwards instead of asserting), but still refuses votes and does not campaign, until
//! it has applied that index. Then the mark is cleared and the group is an ordinary voter.
//!
//! The marks live in `{data_dir}/rejoin.state`, written before `node.toml`, so a crash at any
//! point of the rehydration restarts just as safe:
//!
//! ```text
//! magic "URJN", version u32 LE (1), count u32 LE,
//! count x (group u32 LE, state u8 (1 awaiting, 2 rehydrating), until u64 LE),
//! crc32c u32 LE of everything before it
//! ```

use super::*;

use crate::wire::{self, AllowAnswer};

/// Name of the marks file in the data directory.
pub const FILE_NAME: &str = "rejoin.state";
const MAGIC: &[u8; 4] = b"URJN";
const VERSION: u32 = 1;
/// How long a leader waits for the wiped node to take the permission.
const ALLOW_TIMEOUT: Duration = Duration::from_secs(5);

/// Where one group of this node stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mark {
    /// Refuses every Raft RPC of the group until a leader allows it.
    Awaiting,
    /// Takes the leader's entries; votes and campaigns once it applied `until`.
    Rehydrating { until: u64 },
}

/// The marks of every group (a group without one takes part normally).
#[derive(Debug)]
pub(crate) struct Rejoin {
    path: PathBuf,
    marks: Mutex<BTreeMap<u32, Mark>>,
    /// Whether the node's shed state lets its groups campaign (`transfer.rs`): a group whose
    /// mark clears campaigns only if it does.
    shed_allows: AtomicBool,
}

fn encode(marks: &BTreeMap<u32, Mark>) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + marks.len() * 13);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(marks.len() as u32).to_le_bytes());
    for (g, m) in marks {
        let (state, until) = match m {
            Mark::Awaiting => (1u8, 0u64),
            Mark::Rehydrating { until } => (2, *until),
        };
        out.extend_from_slice(&g.to_le_bytes());
        out.push(state);
        out.extend_from_slice(&until.to_le_bytes());
    }
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

fn decode(bytes: &[u8]) -> Result<BTreeMap<u32, Mark>, String> {
    let body_len = bytes.len().checked_sub(4).ok_or("truncated")?;
    let (body, crc) = bytes.split_at(body_len);
    if crc32c::crc32c(body).to_le_bytes() != crc {
        return Err("checksum mismatch".into());
    }
    if body.get(..4) != Some(&MAGIC[..]) {
        return Err("bad magic".into());
    }
    let u32_at = |at: usize| -> Result<u32, String> {
        body.get(at..at + 4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_le_bytes)
            .ok_or_else(|| "truncated".to_owned())
    };
    let version = u32_at(4)?;
    if version != VERSION {
        return Err(format!(
            "unsupported version {version} (this node reads {VERSION})"
        ));
    }
    let count = u32_at(8)? as usize;
    if body.len() != 12 + count * 13 {
        return Err("length does not match the count".into());
    }
    let mut marks = BTreeMap::new();
    for i in 0..count {
        let at = 12 + i * 13;
        let group = u32_at(at)?;
        let until = body
            .get(at + 5..at + 13)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)
            .ok_or("truncated")?;
        let mark = match body[at + 4] {
            1 => Mark::Awaiting,
            2 => Mark::Rehydrating { until },
            s => return Err(format!("unknown state {s} of group {group}")),
        };
        marks.insert(group, mark);
    }
    Ok(marks)
}

impl Rejoin {
    /// Loads the marks of `data_dir`; a `wiped` directory without them gets every group
    /// awaiting permission, written to disk before this returns.
    pub(super) fn open(
        data_dir: &Path,
        wiped: bool,
        group_count: u32,
    ) -> Result<Rejoin, RaftError> {
        let path = data_dir.join(FILE_NAME);
        let marks = match fs::read(&path) {
            Ok(bytes) => decode(&bytes)
                .map_err(|e| RaftError::Corrupt(format!("{}: {e}", path.display())))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => return Err(RaftError::io(&path, e)),
        };
        let r = Rejoin {
            path,
            marks: Mutex::new(marks),
            shed_allows: AtomicBool::new(true),
        };
        if wiped && r.lock().is_empty() && !r.path.exists() {
            let all: BTreeMap<u32, Mark> = (0..group_count).map(|g| (g, Mark::Awaiting)).collect();
            r.persist(&all)?;
            *r.lock() = all;
            tracing::warn!(
                groups = group_count,
                "empty data directory in a running cluster: every raft group awaits its \
                 leader's permission (allow-next-revert) before this node takes part"
            );
        }
        Ok(r)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u32, Mark>> {
        self.marks.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes `marks` durably (temp file, fsync, rename, fsync of the directory).
    fn persist(&self, marks: &BTreeMap<u32, Mark>) -> Result<(), RaftError> {
        let tmp = self.path.with_extension("tmp");
        let io = |e| RaftError::io(&self.path, e);
        {
            let mut f = fs::File::create(&tmp).map_err(io)?;
            std::io::Write::write_all(&mut f, &encode(marks)).map_err(io)?;
            f.sync_all().map_err(io)?;
        }
        fs::rename(&tmp, &self.path).map_err(io)?;
        if let Some(dir) = self.path.parent() {
            fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io)?;
        }
        Ok(())
    }

    /// Lets `group` campaign if the shed state allows it (`shed_allows`) and it has no mark.
    /// Every switch of campaigning goes through here or [`Rejoin::complete`], under the marks'
    /// lock, so a shed change and the end of a rehydration never undo each other.
    pub(crate) fn set_elect(&self, group: u32, raft: &Raft, shed_allows: bool) {
        let marks = self.lock();
        self.shed_allows.store(shed_allows, Ordering::SeqCst);
        raft.runtime_config()
            .elect(shed_allows && !marks.contains_key(&group));
    }

    /// Clears `group`'s mark if it is still `Rehydrating { until }` (a later permission may
    /// have raised the index), durably, and lets it campaign as the shed state allows.
    fn complete(&self, group: u32, until: u64, raft: &Raft) -> Result<bool, RaftError> {
        let mut marks = self.lock();
        if marks.get(&group) != Some(&Mark::Rehydrating { until }) {
            return Ok(false);
        }
        let mut next = marks.clone();
        next.remove(&group);
        self.persist(&next)?;
        *marks = next;
        raft.runtime_config()
            .elect(self.shed_allows.load(Ordering::SeqCst));
        Ok(true)
    }

    pub(crate) fn mark(&self, group: u32) -> Option<Mark> {
        self.lock().get(&group).copied()
    }

    /// Groups awaiting permission, and groups rehydrating with the index they must apply.
    pub(crate) fn status(&self) -> (Vec<u32>, Vec<(u32, u64)>) {
        let marks = self.lock();
        let awaiting = marks
            .iter()
            .filter(|(_, m)| **m == Mark::Awaiting)
            .map(|(g, _)| *g)
            .collect();
        let rehydrating = marks
            .iter()
            .filter_map(|(g, m)| match m {
                Mark::Rehydrating { until } => Some((*g, *until)),
                Mark::Awaiting => None,
            })
            .collect();
        (awaiting, rehydrating)
    }

    /// Changes one group's mark (`None` clears it), durably; returns the previous one.
    fn set(&self, group: u32, mark: Option<Mark>) -> Result<Option<Mark>, RaftError> {
        let mut marks = self.lock();
        let mut next = marks.clone();
        let prev = match mark {
            Some(m) => next.insert(group, m),
            None => next.remove(&group),
        };
        if prev != mark {
            self.persist(&next)?;
            *marks = next;
        }
        Ok(prev)
    }
}

/// Why a leader could not give a permission.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllowError {
    NoSuchGroup(u32),
    /// This node does not lead the group; who does, if known.
    NotLeader(Option<u64>),
    /// The node named is not a voter of the group, or is the leader itself.
    BadNode(String),
    /// The wiped node did not take it (unreachable, or it failed to record it).
    Unavailable(String),
}

impl std::fmt::Display for AllowError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AllowError::NoSuchGroup(g) => write!(f, "no raft group {g}"),
            AllowError::NotLeader(Some(l)) => {
                write!(f, "this node does not lead the group; node {l} does")
            }
            AllowError::NotLeader(None) => {
                write!(f, "this node does not lead the group; no leader is known")
            }
            AllowError::BadNode(m) | AllowError::Unavailable(m) => f.write_str(m),
        }
    }
}

/// What a leader's permission did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allowed {
    /// The leader's commit index sent along: the node votes again once it applied it.
    pub commit_index: u64,
    /// `"armed"` (the node was awaiting and now rehydrates), `"rehydrating"` (it already
    /// had a permission; the index may have risen) or `"not-awaiting"` (it takes part
    /// normally; nothing changed).
    pub state: &'static str,
}

impl Node {
    pub(crate) fn rejoin_gate(&self, frame: &[u8]) -> Result<(), String> {
        let (Some(&kind), Some(group)) = (frame.get(5), frame.get(6..10)) else {
            return Ok(());
        };
        let group = u32::from_le_bytes([group[0], group[1], group[2], group[3]]);
        let Some(mark) = self.rejoin.mark(group) else {
            return Ok(());
        };
        let passes = match mark {
            Mark::Awaiting => matches!(kind, wire::KIND_PROPOSE | wire::KIND_ALLOW),
            Mark::Rehydrating { .. } => matches!(
                kind,
                wire::KIND_APPEND | wire::KIND_SNAPSHOT | wire::KIND_PROPOSE | wire::KIND_ALLOW
            ),
        };
        if passes {
            return Ok(());
        }
        let me = self.node_id;
        Err(match mark {
            Mark::Awaiting => format!(
                "node {me} rejoins with an empty data directory: group {group} awaits its \
                 leader's permission (POST /__ursula/raft/{group}/nodes/{me}/allow-next-revert \
                 on the leader, or ursulactl allow-rejoin --node {me})"
            ),
            Mark::Rehydrating { until } => format!(
                "node {me} is rehydrating group {group} (until it applied index {until}): it \
                 neither votes nor campaigns yet"
            ),
        })
    }

    /// Handles a frame before the ordinary dispatch: refuses what a marked group must not take
    /// (`Err`), answers a permission (`Some`), or lets the frame through (`None`).
    pub(crate) async fn handle_rejoin_rpc(&self, frame: &[u8]) -> Result<Option<Vec<u8>>, String> {
        if let Err(reason) = self.rejoin_gate(frame) {
            // A transfer's elect gets a refusal it understands (the leader moves on to
            // another target at once); anything else a failed send, retried.
            if frame.get(5) == Some(&wire::KIND_ELECT) {
                return Ok(Some(wire::encode_response::<wire::ElectResult>(&Err(
                    reason,
                ))));
            }
            return Err(reason);
        }
        let Some((group, until)) = wire::decode_allow(frame)? else {
            return Ok(None);
        };
        let g = self
            .groups
            .get(group as usize)
            .ok_or_else(|| format!("no raft group {group} on node {}", self.node_id))?;
        let answer: AllowAnswer = match self.rejoin.mark(group) {
            None => Ok(0),
            Some(m) => {
                let until = match m {
                    Mark::Rehydrating { until: had } => had.max(until),
                    Mark::Awaiting => until,
                };
                match self.rejoin.set(group, Some(Mark::Rehydrating { until })) {
                    Ok(_) => {
                        tracing::info!(group, until, "permission to rejoin: rehydrating");
                        spawn_completion(&self.rejoin, group, g.raft.clone(), until);
                        Ok(if m == Mark::Awaiting { 1 } else { 2 })
                    }
                    Err(e) => Err(e.to_string()),
                }
            }
        };
        Ok(Some(wire::encode_response(&answer)))
    }

    /// Leader side of `allow-next-revert`: sends `node` the one-shot permission for `group`
    /// with this leader's commit index.
    pub async fn allow_next_revert(&self, group: u32, node: u64) -> Result<Allowed, AllowError> {
        let g = self
            .groups
            .get(group as usize)
            .ok_or(AllowError::NoSuchGroup(group))?;
        if let Some(leader) = self.not_leading(group) {
            return Err(AllowError::NotLeader(leader));
        }
        if node == self.node_id {
            return Err(AllowError::BadNode(format!(
                "node {node} leads group {group}: it needs no permission"
            )));
        }
        let voters: Vec<u64> = {
            let m = g.raft.metrics();
            let m = m.borrow();
            m.membership_config.membership().voter_ids().collect()
        };
        if !voters.contains(&node) {
            return Err(AllowError::BadNode(format!(
                "node {node} is not a voter of group {group} (voters {voters:?})"
            )));
        }
        // Confirmed with a quorum, and at least everything acknowledged so far (a leader that
        // just restarted may not have re-committed its log yet: its read index covers it).
        let read = tokio::time::timeout(ALLOW_TIMEOUT, g.raft.ensure_linearizable())
            .await
            .map_err(|_| AllowError::Unavailable("leadership not confirmed in time".into()))?
            .map_err(|e| match e {
                openraft::error::RaftError::APIError(
                    openraft::error::CheckIsLeaderError::ForwardToLeader(f),
                ) => AllowError::NotLeader(f.leader_id),
                e => AllowError::Unavailable(e.to_string()),
            })?;
        let committed = g
            .raft
            .with_raft_state(|st| st.committed.map(|c| c.index))
            .await
            .map_err(|e| AllowError::Unavailable(e.to_string()))?;
        let commit_index = read.map(|l| l.index).max(committed).unwrap_or(0);
        let transport = self
            .transport
            .as_ref()
            .ok_or_else(|| AllowError::Unavailable("this node has no peers".into()))?;
        let answer = transport
            .send(node, wire::encode_allow(group, commit_index), ALLOW_TIMEOUT)
            .await
            .map_err(|e| AllowError::Unavailable(e.to_string()))?;
        let state: AllowAnswer = wire::decode_response(&answer)
            .map_err(|e| AllowError::Unavailable(format!("bad answer from node {node}: {e}")))?;
        let state = match state.map_err(AllowError::Unavailable)? {
            0 => "not-awaiting",
            1 => "armed",
            _ => "rehydrating",
        };
        tracing::info!(group, node, commit_index, state, "allow-next-revert");
        Ok(Allowed {
            commit_index,
            state,
        })
    }

    /// Groups of this node that await a leader's permission to take part (a wiped data dir).
    pub fn groups_awaiting_permission(&self) -> Vec<u32> {
        self.rejoin.status().0
    }

    /// Groups rehydrating after a permission, with the index each must apply before voting.
    pub fn groups_rehydrating(&self) -> Vec<(u32, u64)> {
        self.rejoin.status().1
    }

    /// Whether `group` must not campaign or accept leadership here (awaiting or rehydrating).
    pub fn rejoin_blocks_leadership(&self, group: u32) -> bool {
        self.rejoin.mark(group).is_some()
    }
}

/// At open: groups with a mark do not campaign; rehydrating ones resume their watch.
pub(super) fn start(rejoin: &Arc<Rejoin>, groups: &[Group]) {
    for (g, mark) in rejoin.lock().clone() {
        let Some(group) = groups.get(g as usize) else {
            continue;
        };
        group.raft.runtime_config().elect(false);
        if let Mark::Rehydrating { until } = mark {
            spawn_completion(rejoin, g, group.raft.clone(), until);
        }
    }
}

/// Clears `group`'s mark once it applied `until` (and lets it campaign again); ends with the
/// group's Raft.
fn spawn_completion(rejoin: &Arc<Rejoin>, group: u32, raft: Raft, until: u64) {
    let rejoin = Arc::clone(rejoin);
    tokio::spawn(async move {
        let mut rx = raft.metrics();
        loop {
            let done = rx.borrow().last_applied.is_some_and(|l| l.index >= until);
            if done {
                break;
            }
            if rx.changed().await.is_err() {
                return;
            }
        }
        match rejoin.complete(group, until, &raft) {
            Ok(true) => {
                tracing::info!(
                    group,
                    until,
                    "rehydrated: the group votes and campaigns again"
                )
            }
            Ok(false) => {}
            Err(e) => {
                tracing::error!(group, error = %e, "recording the end of a rehydration failed")
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_round_trip_and_damage_is_refused() {
        let marks = BTreeMap::from([(0, Mark::Awaiting), (7, Mark::Rehydrating { until: 42 })]);
        let bytes = encode(&marks);
        assert_eq!(decode(&bytes), Ok(marks));
        assert_eq!(decode(&encode(&BTreeMap::new())), Ok(BTreeMap::new()));
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x40;
            assert!(decode(&bad).is_err(), "flip at {i} accepted");
        }
        assert!(decode(&bytes[..bytes.len() - 1]).is_err());
        assert!(decode(b"").is_err());
    }

    #[test]
    fn a_wiped_dir_awaits_and_the_marks_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let r = Rejoin::open(dir.path(), true, 3).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.status(), (vec![0, 1, 2], vec![]));
        r.set(1, Some(Mark::Rehydrating { until: 9 }))
            .unwrap_or_else(|e| panic!("{e}"));
        r.set(2, None).unwrap_or_else(|e| panic!("{e}"));
        // Reopened as not wiped (node.toml exists by then): the marks stay.
        let r = Rejoin::open(dir.path(), false, 3).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.status(), (vec![0], vec![(1, 9)]));
        // An intact directory has no marks at all.
        let other = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let r = Rejoin::open(other.path(), false, 3).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.status(), (vec![], vec![]));
        assert!(!other.path().join(FILE_NAME).exists());
    }
}
