//! The conformance suite every [`ColdStore`] backend runs: local, memory, the fault-injecting
//! twin (faults off) and a real S3-compatible server. Each check panics with what broke.
//!
//! Checks: conditional create (and eight racing creates of one key), missing objects, exact and
//! invalid ranges, idempotent delete and re-create, prefix listing, empty and 3 MiB objects,
//! bodies in pieces, framed objects.
//!
//! Runs below a caller-chosen prefix, so runs sharing a bucket do not see each other.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "a test suite")]

use super::object::{self, magic};
use super::{Body, ColdError, ColdStore, ObjectKey};
use bytes::Bytes;

fn key(prefix: &ObjectKey, rest: &str) -> ObjectKey {
    ObjectKey::new(format!("{prefix}/{rest}")).unwrap()
}

/// Runs every check against `store`, below `prefix` (which should be unique to the run).
pub async fn suite(store: &dyn ColdStore, prefix: &ObjectKey) {
    store.probe().await.expect("probe of a healthy store");
    create_is_conditional(store, prefix).await;
    concurrent_creates_have_one_winner(store, prefix).await;
    missing_objects(store, prefix).await;
    ranged_reads(store, prefix).await;
    delete_is_idempotent(store, prefix).await;
    list_by_prefix(store, prefix).await;
    empty_and_large_objects(store, prefix).await;
    pieces_are_one_object(store, prefix).await;
    framed_objects(store, prefix).await;
}

async fn create_is_conditional(store: &dyn ColdStore, prefix: &ObjectKey) {
    let k = key(prefix, "create/one");
    store
        .put_if_absent(&k, Bytes::from_static(b"first").into())
        .await
        .unwrap();
    assert_eq!(store.get(&k).await.unwrap(), &b"first"[..]);
    let err = store
        .put_if_absent(&k, Bytes::from_static(b"second!").into())
        .await
        .unwrap_err();
    assert!(
        matches!(err, ColdError::AlreadyExists { .. }),
        "second create: {err:?}"
    );
    assert_eq!(store.get(&k).await.unwrap(), &b"first"[..], "not replaced");
    let head = store.head(&k).await.unwrap();
    assert_eq!(head.key, k);
    assert_eq!(head.size, 5);
    // 2020-01-01: the store reports a real modification time.
    assert!(head.last_modified_ms > 1_577_836_800_000, "{head:?}");
}

async fn concurrent_creates_have_one_winner(store: &dyn ColdStore, prefix: &ObjectKey) {
    let k = key(prefix, "race/obj");
    let bodies: Vec<Bytes> = (0..8u8).map(|i| Bytes::from(vec![i; 1000])).collect();
    let results = futures::future::join_all(
        bodies
            .iter()
            .map(|b| store.put_if_absent(&k, b.clone().into()))
            .collect::<Vec<_>>(),
    )
    .await;
    let winners: Vec<usize> = (0..results.len()).filter(|i| results[*i].is_ok()).collect();
    assert_eq!(winners.len(), 1, "{results:?}");
    for r in &results {
        if let Err(e) = r {
            assert!(matches!(e, ColdError::AlreadyExists { .. }), "{e:?}");
        }
    }
    assert_eq!(store.get(&k).await.unwrap(), bodies[winners[0]]);
}

async fn missing_objects(store: &dyn ColdStore, prefix: &ObjectKey) {
    let k = key(prefix, "missing/x");
    let not_found = |r: Result<(), ColdError>, op: &str| {
        assert!(
            matches!(r, Err(ColdError::NotFound { .. })),
            "{op} of a missing object: {r:?}"
        );
    };
    not_found(store.get(&k).await.map(drop), "get");
    not_found(store.get_range(&k, 0..1).await.map(drop), "get_range");
    not_found(store.head(&k).await.map(drop), "head");
}

async fn ranged_reads(store: &dyn ColdStore, prefix: &ObjectKey) {
    let k = key(prefix, "range/obj");
    let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
    store
        .put_if_absent(&k, Bytes::from(data.clone()).into())
        .await
        .unwrap();
    for r in [0..1, 0..10_000, 9_999..10_000, 17..4_113, 5_000..5_001] {
        let got = store.get_range(&k, r.clone()).await.unwrap();
        assert_eq!(&got[..], &data[r.start as usize..r.end as usize], "{r:?}");
    }
    #[allow(
        clippy::reversed_empty_ranges,
        reason = "the reversed range is the point"
    )]
    for r in [5..5, 7..3, 9_990..10_001, 10_000..10_001, 20_000..20_010] {
        let err = store.get_range(&k, r.clone()).await.unwrap_err();
        assert!(
            matches!(err, ColdError::InvalidRange { .. }),
            "{r:?}: {err:?}"
        );
    }
}

async fn delete_is_idempotent(store: &dyn ColdStore, prefix: &ObjectKey) {
    let k = key(prefix, "delete/obj");
    store
        .put_if_absent(&k, Bytes::from_static(b"x").into())
        .await
        .unwrap();
    store.delete(&k).await.unwrap();
    assert!(matches!(
        store.get(&k).await,
        Err(ColdError::NotFound { .. })
    ));
    store.delete(&k).await.expect("deleting a missing object");
    // A deleted key may be created again (GC'd staging keys are reused).
    store
        .put_if_absent(&k, Bytes::from_static(b"again").into())
        .await
        .unwrap();
    assert_eq!(store.get(&k).await.unwrap(), &b"again"[..]);
}

async fn list_by_prefix(store: &dyn ColdStore, prefix: &ObjectKey) {
    let names = [
        "list/a/1",
        "list/a/2",
        "list/a/deep/3",
        "list/ab/4",
        "list/b/5",
    ];
    for (i, n) in names.iter().enumerate() {
        store
            .put_if_absent(&key(prefix, n), vec![0u8; i + 1].into())
            .await
            .unwrap();
    }
    let listed = store.list(&key(prefix, "list/a")).await.unwrap();
    let got: Vec<(String, u64)> = listed.iter().map(|o| (o.key.to_string(), o.size)).collect();
    let want: Vec<(String, u64)> = [("list/a/1", 1), ("list/a/2", 2), ("list/a/deep/3", 3)]
        .iter()
        .map(|(n, s)| (key(prefix, n).to_string(), *s))
        .collect();
    assert_eq!(got, want, "below list/a, sorted, not list/ab");
    assert!(
        store
            .list(&key(prefix, "list/none"))
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(store.list(&key(prefix, "list")).await.unwrap().len(), 5);
}

async fn empty_and_large_objects(store: &dyn ColdStore, prefix: &ObjectKey) {
    let empty = key(prefix, "sizes/empty");
    store
        .put_if_absent(&empty, Bytes::new().into())
        .await
        .unwrap();
    assert!(store.get(&empty).await.unwrap().is_empty());
    assert_eq!(store.head(&empty).await.unwrap().size, 0);
    let big = key(prefix, "sizes/big");
    let data: Vec<u8> = (0..(3 << 20) as u32)
        .map(|i| (i * 31 % 256) as u8)
        .collect();
    store
        .put_if_absent(&big, Bytes::from(data.clone()).into())
        .await
        .unwrap();
    assert!(store.get(&big).await.unwrap() == data);
    let mid = (1 << 20) + 7..(2 << 20) + 11;
    let got = store.get_range(&big, mid.clone()).await.unwrap();
    assert!(got == data[mid.start as usize..mid.end as usize]);
}

async fn pieces_are_one_object(store: &dyn ColdStore, prefix: &ObjectKey) {
    let k = key(prefix, "pieces/obj");
    let pieces: Vec<Bytes> = (0..5u8)
        .map(|i| Bytes::from(vec![i; 1000 + usize::from(i)]))
        .collect();
    let body: Body = pieces.iter().cloned().collect();
    store.put_if_absent(&k, body.clone()).await.unwrap();
    assert_eq!(store.get(&k).await.unwrap(), body.to_bytes());
    assert_eq!(store.head(&k).await.unwrap().size, body.len());
    // Across a piece boundary.
    let got = store.get_range(&k, 990..1010).await.unwrap();
    assert_eq!(&got[..], &body.to_bytes()[990..1010]);
}

async fn framed_objects(store: &dyn ColdStore, prefix: &ObjectKey) {
    let k = key(prefix, "framed/obj");
    let body: Vec<u8> = (0..4096u32).map(|i| (i % 7) as u8).collect();
    store
        .put_if_absent(
            &k,
            Bytes::from(object::encode(magic::TEST, 1, &body)).into(),
        )
        .await
        .unwrap();
    let whole = store.get(&k).await.unwrap();
    assert_eq!(
        object::decode(magic::TEST, &[1], &whole).unwrap().body,
        &body[..]
    );
    let part = store
        .get_range(&k, object::body_range(100..200))
        .await
        .unwrap();
    assert_eq!(&part[..], &body[100..200]);
    // The same object framed from pieces, without concatenating them first.
    let k2 = key(prefix, "framed/pieces");
    let pieces = [
        Bytes::copy_from_slice(&body[..1000]),
        Bytes::copy_from_slice(&body[1000..]),
    ];
    store
        .put_if_absent(&k2, object::frame(magic::TEST, 1, pieces))
        .await
        .unwrap();
    assert_eq!(store.get(&k2).await.unwrap(), whole);
}
