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

#[tokio::test]
async fn suite_local() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = ColdConfig {
        backend: Some(Backend::Local),
        ..Default::default()
    };
    let store = cfg.open(dir.path(), false).unwrap().unwrap();
    testing::suite(store.as_ref(), &run_prefix("local")).await;
    assert!(
        dir.path().join("cold").is_dir(),
        "default {{data_dir}}/cold"
    );
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
