//! Multi-part snapshot routes (snapshot-parts.md §3, §4, §6): stage a part, commit a
//! manifest, discard. Each handler parses, makes the calls the spec orders, and renders; the
//! rules are in [`ursula_core::parts`] and the IO in [`crate::parts`] and
//! [`crate::snapshot_store`].

use super::error::{ApiError, render as render_error};
use super::path::Target;
use super::snapshot::{path_offset, published, snapshot_content_type, snapshot_match};
use super::{ApiResult, body, headers as h, read, render};
use crate::app::App;
use crate::snapshot_store::{self as store, cold_failed};
use axum::body::Body;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, Request, StatusCode};
use std::collections::HashMap;
use std::sync::Arc;
use ursula_core::command::{At, PublishColdSnapshotReq};
use ursula_core::parts::{self as rules, PartId};
use ursula_core::snapshot::{ColdSnapshotRef, Digest, DigestBuilder};
use ursula_core::{ErrorCode, Incarnation, Rejection, StreamKey};
use ursula_storage::cold::object::{self, magic};
use ursula_storage::cold::{ColdError, ColdStore, ObjectKey};

pub static STREAM_SNAPSHOT_PART: HeaderName = HeaderName::from_static("stream-snapshot-part");
pub static MAX_STAGED_PARTS_HDR: HeaderName = HeaderName::from_static("ursula-max-staged-parts");
pub static MAX_STAGED_BYTES_HDR: HeaderName = HeaderName::from_static("ursula-max-staged-bytes");
pub static MAX_SNAPSHOT_BYTES_HDR: HeaderName =
    HeaderName::from_static("ursula-max-snapshot-bytes");

/// `307`/`503 LEADER_UNAVAILABLE`: the parts routes are answered by the group's leader.
fn leader(app: &App, key: &StreamKey) -> Result<(), ApiError> {
    if app.node.leaderless_groups().contains(&app.group_of(key)) {
        return Err(ApiError::new(
            ErrorCode::LEADER_UNAVAILABLE,
            "the stream's group has no leader right now",
        ));
    }
    Ok(())
}

/// The stream (404 / 410) and the incarnation precondition (412): the current incarnation
/// and when it was created.
fn current(
    app: &App,
    key: &StreamKey,
    want: Option<Incarnation>,
) -> Result<(read::View, u64), ApiError> {
    let v = read::view(app, key, app.now_ms())?;
    if want.is_some_and(|w| w != v.incarnation) {
        let inc = v.incarnation;
        return Err(Rejection::new(
            ErrorCode::INCARNATION_MISMATCH,
            "the stream is another incarnation",
        )
        .with(|f| f.incarnation = Some(inc))
        .into());
    }
    let created = app.with_stream(key, |s| s.created_at_ms).unwrap_or(0);
    Ok((v, created))
}

fn content_length(hm: &HeaderMap) -> Option<u64> {
    hm.get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
}

fn part_key(key: &StreamKey, id: &PartId) -> Result<ObjectKey, ApiError> {
    store::parts_prefix(key)
        .and_then(|p| p.child(&id.to_string()))
        .map_err(|e| cold_failed("name a part", &e))
}

/// `POST .../snapshot/{offset}/parts` (§3).
pub async fn stage(app: &Arc<App>, target: &Target, seg: &str, req: Request<Body>) -> ApiResult {
    let cold = store::store_of(app)?;
    let (parts, body) = req.into_parts();
    let hm = &parts.headers;
    path_offset(seg)?;
    let want = h::incarnation(hm)?;
    let declared = content_length(hm);
    if declared.is_some_and(|n| n > rules::MAX_PART_BYTES) {
        return Err(ApiError::new(
            ErrorCode::PAYLOAD_TOO_LARGE,
            format!("a part is at most {} bytes", rules::MAX_PART_BYTES),
        ));
    }
    leader(app, &target.key)?;
    let (v, created) = current(app, &target.key, want)?;
    let upload =
        match crate::parts::admit_part(app, &*cold, &target.key, v.incarnation, created, declared)
            .await
        {
            Ok(u) => u,
            Err(Err(e)) => return Err(e),
            Err(Ok(hit)) => return Ok(staged_limit(v.incarnation, hit)),
        };
    let (blob, _charge) = body::read_owned(app, hm, body, rules::MAX_PART_BYTES).await?;
    if blob.is_empty() {
        return Err(ApiError::new(
            ErrorCode::INVALID_SNAPSHOT,
            "a part holds at least one byte",
        ));
    }
    let id = PartId {
        incarnation: v.incarnation,
        unique: store::random_u64(),
    };
    let len = blob.len() as u64;
    cold.put_if_absent(
        &part_key(&target.key, &id)?,
        object::frame(magic::PART, store::PART_VERSION, [blob]),
    )
    .await
    .map_err(|e| cold_failed("store the part", &e))?;
    upload.stored(len);
    let mut resp = render::empty(StatusCode::CREATED);
    h::put(resp.headers_mut(), &STREAM_SNAPSHOT_PART, &id.to_string());
    h::put_incarnation(resp.headers_mut(), v.incarnation);
    Ok(resp)
}

/// `429 STAGED_PARTS_LIMIT` with the bound it hit, and no `Retry-After` (§8).
fn staged_limit(inc: Incarnation, hit: rules::BoundHit) -> http::Response<Body> {
    let rejection = Rejection::new(
        ErrorCode::STAGED_PARTS_LIMIT,
        "the stream holds as many staged parts as it may; commit or discard them first",
    )
    .with(|f| f.incarnation = Some(inc));
    let mut resp = render_error(rejection.into());
    let hm = resp.headers_mut();
    if hit.parts {
        h::put_u64(hm, &MAX_STAGED_PARTS_HDR, rules::MAX_STAGED_PARTS);
    }
    if hit.bytes {
        h::put_u64(hm, &MAX_STAGED_BYTES_HDR, rules::MAX_STAGED_BYTES);
    }
    resp
}

/// `DELETE .../snapshot/parts` (§6).
pub async fn discard(app: &Arc<App>, target: &Target, hm: &HeaderMap) -> ApiResult {
    store::store_of(app)?;
    let want = h::incarnation(hm)?;
    leader(app, &target.key)?;
    let (v, _) = current(app, &target.key, want)?;
    crate::parts::discard(app, &target.key, v.incarnation).await?;
    let mut resp = render::empty(StatusCode::NO_CONTENT);
    h::put_incarnation(resp.headers_mut(), v.incarnation);
    Ok(resp)
}

/// Whether an answer is final for the commit's key, so its parts are deleted (§5).
fn final_for_key(code: ErrorCode) -> bool {
    use ErrorCode::*;
    matches!(
        code,
        STREAM_NOT_FOUND
            | BUCKET_NOT_FOUND
            | STREAM_SOFT_DELETED
            | STREAM_GONE
            | SNAPSHOT_CONFLICT
            | INCARNATION_MISMATCH
            | INVALID_SNAPSHOT
            | UNKNOWN_SNAPSHOT_PART
    )
}

/// Deletes the listed parts of this stream (any incarnation) once the answer has gone out,
/// then has the stream's parts listed again (§5).
fn delete_parts_after(app: &Arc<App>, cold: Arc<dyn ColdStore>, key: &StreamKey, ids: Vec<PartId>) {
    let (app, key) = (app.clone(), key.clone());
    tokio::spawn(async move {
        tokio::task::yield_now().await;
        for id in ids {
            if let Ok(k) = part_key(&key, &id)
                && let Err(e) = cold.delete(&k).await
            {
                tracing::warn!(key = %k, error = %e, "deleting a spent part failed");
            }
        }
        app.parts.mark_for_listing(&key);
    });
}

struct Commit {
    offset: u64,
    count: usize,
    digest: Digest,
    content_type: String,
    snapshot_match: Option<String>,
    want: Option<Incarnation>,
}

fn commit_headers(hm: &HeaderMap, seg: &str) -> Result<Commit, ApiError> {
    let offset = path_offset(seg)?;
    let count = rules::parse_parts_count(
        hm.get(&h::STREAM_SNAPSHOT_PARTS)
            .map_or(&b""[..], |v| v.as_bytes()),
    )?;
    let digest = hm
        .get(&h::STREAM_SNAPSHOT_DIGEST)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| Digest::parse(v.trim()))
        .ok_or_else(|| {
            ApiError::new(
                ErrorCode::INVALID_HEADER,
                "a commit needs Stream-Snapshot-Digest: 64 lowercase hex digits",
            )
        })?;
    let snapshot_match = snapshot_match(hm)?;
    let want = h::incarnation(hm)?;
    let content_type = snapshot_content_type(hm)?;
    Ok(Commit {
        offset,
        count,
        digest,
        content_type,
        snapshot_match,
        want,
    })
}

/// The manifest (B1), read without a budget reservation; too long is an oversized manifest.
async fn read_manifest(
    app: &App,
    hm: &HeaderMap,
    body: Body,
    count: usize,
) -> Result<Vec<PartId>, ApiError> {
    let bytes = body::read_unreserved(app, hm, body, rules::MAX_MANIFEST_BYTES as u64)
        .await
        .map_err(|e| match e.code() {
            ErrorCode::PAYLOAD_TOO_LARGE => ApiError::new(
                ErrorCode::INVALID_SNAPSHOT_MANIFEST,
                format!(
                    "the manifest is longer than {} bytes",
                    rules::MAX_MANIFEST_BYTES
                ),
            ),
            _ => e,
        })?;
    Ok(rules::parse_manifest(&bytes, count)?)
}

/// `PUT .../snapshot/{offset}` with `Stream-Snapshot-Parts` (§4).
pub async fn commit(app: &Arc<App>, target: &Target, seg: &str, req: Request<Body>) -> ApiResult {
    let cold = store::store_of(app)?;
    let (parts, body) = req.into_parts();
    let hm = &parts.headers;
    let c = commit_headers(hm, seg)?;
    let key = &target.key;
    leader(app, key)?;
    // A5-A12: decided before the manifest is read; final for the key, so the parts go.
    let pre = current(app, key, c.want).and_then(|(v, created)| {
        let repeat = app
            .with_stream(key, |s| {
                s.precheck_publish(At::Offset(c.offset), c.digest, c.snapshot_match.as_deref())
            })
            .unwrap_or(Ok(None))?;
        Ok((v, created, repeat))
    });
    let inc = match pre {
        Ok((v, _, None)) => v.incarnation,
        decided => {
            let ids = read_manifest(app, hm, body, c.count)
                .await
                .unwrap_or_default();
            delete_parts_after(app, cold, key, ids);
            return match decided {
                Ok((_, _, Some(r))) => Ok(published(&r)),
                Err(e) => Err(e),
                Ok((_, _, None)) => Err(ApiError::new(ErrorCode::INTERNAL_ERROR, "unreachable")),
            };
        }
    };
    let mut running = app.parts.start_commit(key)?;
    running.admit_copy(&app.body_budget)?;
    let ids = read_manifest(app, hm, body, c.count).await?;
    // B2, B3: every part is this stream's, of the current incarnation, and they fit.
    let listed = cold
        .list(&store::parts_prefix(key).map_err(|e| cold_failed("name", &e))?)
        .await
        .map_err(|e| cold_failed("list the staged parts", &e))?;
    let sizes: HashMap<String, u64> = listed
        .into_iter()
        .filter_map(|i| {
            let name = i.key.as_str().rsplit('/').next()?.to_owned();
            Some((name, i.size.saturating_sub(crate::parts::FRAME_LEN)))
        })
        .collect();
    let mut lens = Vec::with_capacity(ids.len());
    for id in &ids {
        match sizes.get(&id.to_string()) {
            Some(n) if id.incarnation == inc => lens.push(*n),
            _ => return Err(unknown_part(id)),
        }
    }
    let total = rules::check_total(&lens)?;
    // B4, B5: copy piece by piece, hashing as it goes.
    let stem =
        store::new_stem(key, inc, c.offset, &c.digest).map_err(|e| cold_failed("name", &e))?;
    let _flight = app.parts.flights.enter(&stem);
    let copied = copy(&*cold, key, &ids, &stem, &c.content_type).await;
    let (pieces, digest) = match copied {
        Ok(done) => done,
        Err((Copy::Store(e), written)) => {
            spawn_delete_keys(cold, written);
            return Err(cold_failed("copy the parts", &e));
        }
        Err((Copy::Missing(id), written)) => {
            spawn_delete_keys(cold.clone(), written);
            // A stream deleted or recreated meanwhile answers for its current state.
            if let Err(e) = current(app, key, c.want).and_then(|(v, _)| {
                if v.incarnation == inc {
                    Ok(())
                } else {
                    Err(unknown_part(&id))
                }
            }) {
                delete_parts_after(app, cold, key, ids);
                return Err(e);
            }
            return Err(unknown_part(&id));
        }
    };
    if digest != c.digest {
        spawn_delete_keys(
            cold.clone(),
            pieces.iter().map(|(k, _)| k.clone()).collect(),
        );
        delete_parts_after(app, cold, key, ids);
        return Err(ApiError::new(
            ErrorCode::SNAPSHOT_DIGEST_MISMATCH,
            format!(
                "the parts' digest is {digest}, not the Stream-Snapshot-Digest; upload them again"
            ),
        ));
    }
    let man = ObjectKey::new(format!("{stem}.man")).map_err(|e| cold_failed("name", &e))?;
    let body = object::frame(
        magic::MANIFEST,
        store::MANIFEST_VERSION,
        [Bytes::from(store::manifest_body(&pieces))],
    );
    if let Err(e) = cold.put_if_absent(&man, body).await {
        spawn_delete_keys(cold, pieces.into_iter().map(|(k, _)| k).collect());
        return Err(cold_failed("store the snapshot manifest", &e));
    }
    // Phase C.
    let res = store::publish(
        app,
        &cold,
        PublishColdSnapshotReq {
            key: key.clone(),
            incarnation: c.want,
            parts_incarnation: Some(inc),
            at: At::Offset(c.offset),
            content_type: c.content_type,
            digest,
            snapshot_match: c.snapshot_match,
            object: ColdSnapshotRef {
                key: man.to_string(),
                len: total,
            },
        },
    )
    .await;
    match &res {
        Ok(_) => delete_parts_after(app, cold, key, ids),
        Err(e) if final_for_key(e.code()) => delete_parts_after(app, cold, key, ids),
        Err(_) => {}
    }
    res.map(|r| published(&r))
}

fn unknown_part(id: &PartId) -> ApiError {
    ApiError::new(
        ErrorCode::UNKNOWN_SNAPSHOT_PART,
        format!(
            "part {id} is not a staged part of this stream's current incarnation (unknown, \
             another stream's, an earlier incarnation's, or swept)"
        ),
    )
}

fn spawn_delete_keys(cold: Arc<dyn ColdStore>, keys: Vec<ObjectKey>) {
    tokio::spawn(async move {
        for k in keys {
            let _ = cold.delete(&k).await;
        }
    });
}

enum Copy {
    Store(ColdError),
    Missing(PartId),
}

type Copied = (Vec<(ObjectKey, u64)>, Digest);

/// Copies the parts in order into `{stem}.p{n}` pieces, reading the next part while the
/// current one uploads, and computes the snapshot's digest. On failure, the pieces written.
async fn copy(
    cold: &dyn ColdStore,
    key: &StreamKey,
    ids: &[PartId],
    stem: &str,
    ct: &str,
) -> Result<Copied, (Copy, Vec<ObjectKey>)> {
    let mut hasher = DigestBuilder::new(ct);
    let mut pieces: Vec<(ObjectKey, u64)> = Vec::with_capacity(ids.len());
    let written = |p: &Vec<(ObjectKey, u64)>| p.iter().map(|(k, _)| k.clone()).collect();
    let mut next = Some(read_part(cold, key, &ids[0]).await);
    for (i, _) in ids.iter().enumerate() {
        let part = match next.take() {
            Some(Ok(b)) => b,
            Some(Err(e)) => return Err((e, written(&pieces))),
            None => break,
        };
        let piece = ObjectKey::new(format!("{stem}.p{i:05}"))
            .map_err(|e| (Copy::Store(e), written(&pieces)))?;
        let (h, part) = tokio::task::spawn_blocking(move || {
            hasher.update(&part);
            (hasher, part)
        })
        .await
        .map_err(|_| {
            (
                Copy::Store(ColdError::Unsupported {
                    operation: "hash",
                    detail: "task".into(),
                }),
                written(&pieces),
            )
        })?;
        hasher = h;
        let len = part.len() as u64;
        let put = cold.put_if_absent(
            &piece,
            object::frame(magic::SNAPSHOT, store::SNAPSHOT_VERSION, [part]),
        );
        let (put, fetched) = match ids.get(i + 1) {
            Some(id) => {
                let (p, f) = tokio::join!(put, read_part(cold, key, id));
                (p, Some(f))
            }
            None => (put.await, None),
        };
        put.map_err(|e| (Copy::Store(e), written(&pieces)))?;
        pieces.push((piece, len));
        next = fetched;
    }
    Ok((pieces, hasher.finish()))
}

async fn read_part(cold: &dyn ColdStore, key: &StreamKey, id: &PartId) -> Result<Bytes, Copy> {
    let k = store::parts_prefix(key)
        .and_then(|p| p.child(&id.to_string()))
        .map_err(Copy::Store)?;
    match cold.get(&k).await {
        Ok(bytes) => object::decode(magic::PART, &[store::PART_VERSION], &bytes)
            .map(|f| bytes.slice_ref(f.body))
            .map_err(|e| {
                Copy::Store(ColdError::Unavailable {
                    operation: "decode a part",
                    source: Box::new(e),
                })
            }),
        Err(ColdError::NotFound { .. }) => Err(Copy::Missing(*id)),
        Err(e) => Err(Copy::Store(e)),
    }
}
