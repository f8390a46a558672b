//! The conformance suite on every backend, the fault-injecting twin, and store construction.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

use super::faulty::Op;
use super::*;
use bytes::Bytes;
use std::sync::Arc;

/// A prefix no other run uses (runs may share a bucket).
fn run_prefix(name: &str) -> ObjectKey {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    ObjectKey::new(format!("suite-{name}-{}-{nanos}", std::process::id())).unwrap()
}

#[tokio::test]
async fn suite_memory() {
    testing::suite(&ObjectColdStore::memory(), &run_prefix("memory")).await;
}

/// The default `local` store of a node whose data directory is `data_dir`.
fn local_store(data_dir: &std::path::Path) -> Arc<dyn ColdStore> {
    let cfg = ColdConfig {
        backend: Some(Backend::Local),
        ..Default::default()
    };
    cfg.open(data_dir, false).unwrap().unwrap()
}

#[tokio::test]
async fn suite_local() {
    let dir = tempfile::tempdir().unwrap();
    let store = local_store(dir.path());
    testing::suite(store.as_ref(), &run_prefix("local")).await;
    assert!(
        dir.path().join("cold").is_dir(),
        "default {{data_dir}}/cold"
    );
}

#[tokio::test]
async fn suite_local_shared() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = ColdConfig {
        backend: Some(Backend::Local),
        local: config::LocalConfig {
            path: None,
            shared: true,
        },
        ..Default::default()
    };
    let store = cfg.open(dir.path(), false).unwrap().unwrap();
    testing::suite(store.as_ref(), &run_prefix("shared")).await;
}

/// Every file under `dir`, relative to it.
fn files_below(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else {
                let rel = e.path().strip_prefix(dir).unwrap().to_owned();
                out.push(rel.to_string_lossy().into_owned());
            }
        }
    }
    out.sort();
    out
}

#[tokio::test]
async fn a_local_create_is_a_plain_file_and_leaves_no_staging_file() {
    let dir = tempfile::tempdir().unwrap();
    let store = local_store(dir.path());
    // Several paced pieces, in several body pieces.
    let mut body = Body::new();
    let first: Vec<u8> = (0..700_000u32).map(|i| (i % 251) as u8).collect();
    let second = vec![7u8; 300_001];
    body.push(Bytes::from(first.clone()));
    body.push(Bytes::from(second.clone()));
    let key = ObjectKey::new("chunks/0000000000000001/g00003/00000000000000000001.chunk").unwrap();
    store.put_if_absent_paced(&key, body).await.unwrap();
    let again = store
        .put_if_absent_paced(&key, Bytes::from_static(b"other").into())
        .await
        .unwrap_err();
    assert!(matches!(again, ColdError::AlreadyExists { .. }), "{again}");
    let cold = dir.path().join("cold");
    assert_eq!(files_below(&cold), vec![key.to_string()]);
    let on_disk = std::fs::read(cold.join(key.as_str())).unwrap();
    assert_eq!(on_disk.len(), first.len() + second.len());
    assert_eq!(&on_disk[..first.len()], &first[..]);
    assert_eq!(&on_disk[first.len()..], &second[..]);
    assert_eq!(store.local_file(&key), Some(cold.join(key.as_str())));
}

#[tokio::test]
async fn a_local_create_that_cannot_make_its_directory_fails_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let store = local_store(dir.path());
    // A file where the object's directory should be.
    std::fs::write(dir.path().join("cold/blocked"), b"not a directory").unwrap();
    let key = ObjectKey::new("blocked/g00001/1.chunk").unwrap();
    for paced in [false, true] {
        let body = Body::from(Bytes::from_static(b"bytes"));
        let res = if paced {
            store.put_if_absent_paced(&key, body).await
        } else {
            store.put_if_absent(&key, body).await
        };
        assert!(res.unwrap_err().is_transient(), "paced: {paced}");
    }
    assert_eq!(
        files_below(&dir.path().join("cold")),
        vec!["blocked".to_owned()]
    );
    // The store goes on serving other keys.
    let ok = ObjectKey::new("open/g00001/1.chunk").unwrap();
    store
        .put_if_absent_paced(&ok, Bytes::from_static(b"fine").into())
        .await
        .unwrap();
    assert_eq!(store.get(&ok).await.unwrap(), &b"fine"[..]);
}

#[tokio::test]
async fn suite_local_with_root() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = ColdConfig {
        backend: Some(Backend::Local),
        root: Some("/run-7/".into()),
        ..Default::default()
    };
    let store = cfg.open(dir.path(), false).unwrap().unwrap();
    testing::suite(store.as_ref(), &run_prefix("root")).await;
    assert!(dir.path().join("cold/run-7").is_dir());
}

#[tokio::test]
async fn suite_faulty_twin_without_faults() {
    let twin = FaultyColdStore::new(Arc::new(ObjectColdStore::memory()));
    testing::suite(&twin, &run_prefix("faulty")).await;
    assert!(twin.faults().calls(Op::Put) > 0);
}

/// The suite against a real S3-compatible server. Run by `scripts/s3-suite.sh` (and so by
/// `scripts/test.sh` and CI), which starts one and sets `URSULA_TEST_S3_ENDPOINT`.
#[tokio::test]
#[ignore = "needs an S3-compatible server: scripts/s3-suite.sh runs it"]
async fn suite_s3() {
    let endpoint = std::env::var("URSULA_TEST_S3_ENDPOINT").expect(
        "URSULA_TEST_S3_ENDPOINT is not set: run scripts/s3-suite.sh, which starts the server",
    );
    let cfg = ColdConfig {
        backend: Some(Backend::S3),
        root: Some("conformance".into()),
        s3: config::S3Config {
            bucket: Some(std::env::var("URSULA_TEST_S3_BUCKET").unwrap_or("ursula-test".into())),
            endpoint: Some(endpoint),
            ..Default::default()
        },
        ..Default::default()
    };
    let store = cfg
        .open(std::path::Path::new("/nonexistent"), false)
        .unwrap()
        .unwrap();
    testing::suite(store.as_ref(), &run_prefix("s3")).await;
}

#[tokio::test]
async fn faults_fail_before_or_after_the_store() {
    let inner = Arc::new(ObjectColdStore::memory());
    let twin = FaultyColdStore::new(inner.clone());
    let faults = twin.faults();
    let k = ObjectKey::new("f/a").unwrap();

    faults.fail_next(Op::Put, 1);
    let e = twin
        .put_if_absent(&k, Bytes::from_static(b"1").into())
        .await
        .unwrap_err();
    assert!(e.is_transient(), "{e:?}");
    assert!(matches!(
        inner.head(&k).await,
        Err(ColdError::NotFound { .. })
    ));
    twin.put_if_absent(&k, Bytes::from_static(b"1").into())
        .await
        .unwrap();

    faults.lose_next_put_acks(1);
    let k2 = ObjectKey::new("f/b").unwrap();
    assert!(
        twin.put_if_absent(&k2, Bytes::from_static(b"2").into())
            .await
            .unwrap_err()
            .is_transient()
    );
    assert_eq!(inner.get(&k2).await.unwrap(), &b"2"[..], "written anyway");
    assert!(matches!(
        twin.put_if_absent(&k2, Bytes::from_static(b"2").into())
            .await,
        Err(ColdError::AlreadyExists { .. })
    ));

    // The paced create goes through the same faults.
    faults.fail_next(Op::Put, 1);
    let k3 = ObjectKey::new("f/c").unwrap();
    let paced = |b: &'static [u8]| twin.put_if_absent_paced(&k3, Bytes::from_static(b).into());
    assert!(paced(b"3").await.unwrap_err().is_transient());
    faults.lose_next_put_acks(1);
    assert!(paced(b"3").await.unwrap_err().is_transient());
    assert_eq!(inner.get(&k3).await.unwrap(), &b"3"[..], "written anyway");
    assert!(matches!(
        paced(b"3").await,
        Err(ColdError::AlreadyExists { .. })
    ));

    faults.set_down(true);
    assert!(twin.probe().await.unwrap_err().is_transient());
    assert!(twin.get(&k).await.unwrap_err().is_transient());
    assert!(twin.list(&k).await.is_err());
    faults.set_down(false);
    twin.probe().await.unwrap();
    assert_eq!(twin.get(&k).await.unwrap(), &b"1"[..]);
}

#[tokio::test]
async fn none_builds_no_store_and_errors_are_typed() {
    let dir = tempfile::tempdir().unwrap();
    let none = ColdConfig {
        backend: Some(Backend::None),
        ..Default::default()
    };
    assert!(none.open(dir.path(), false).unwrap().is_none());
    let s3 = ColdConfig {
        backend: Some(Backend::S3),
        ..Default::default()
    };
    assert!(matches!(
        s3.open(dir.path(), false),
        Err(ColdConfigError::MissingBucket)
    ));
    let store = ObjectColdStore::memory();
    assert!(matches!(
        store.get_range(&ObjectKey::new("x").unwrap(), 0..1).await,
        Err(ColdError::NotFound { .. })
    ));
    assert!(!ColdError::NotFound { key: "x".into() }.is_transient());
}
