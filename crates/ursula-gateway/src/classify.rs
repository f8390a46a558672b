//! What a request does, for the policy (cluster.md §12.4): the bucket it acts on, and whether
//! it only reads. Every `GET` and `HEAD` of the table is read-only and every `PUT`, `POST` and
//! `DELETE` is not, so the method decides that; the path decides the bucket, and whether the
//! route is one the gateway knows at all (an unknown one answers `404` with access control).

use http::Method;

/// The usage class of a request (cluster.md §12.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    /// Append, AppendAndClose, Create, CreateAndClose.
    Append,
    /// Read, Head, ReadSnapshot.
    Read,
    /// Tail: a live read.
    LiveRead,
    /// Update, Delete, PublishSnapshot, DeleteSnapshot, AdministerBucket.
    Admin,
}

impl Class {
    pub fn name(self) -> &'static str {
        match self {
            Class::Append => "append",
            Class::Read => "read",
            Class::LiveRead => "live_read",
            Class::Admin => "admin",
        }
    }
}

/// A classified request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Access {
    pub bucket: String,
    pub class: Class,
    pub read_only: bool,
    /// A live read (`live` non-empty): its SSE answer ends when the credential expires.
    pub live: bool,
    /// Whether the path names a stream (its concealment is a missing stream's `404`).
    pub stream: bool,
}

/// Subresources of a stream.
const SUBRESOURCES: [&str; 5] = [
    "bootstrap",
    "attrs",
    "retention",
    "snapshot",
    "append-batch",
];

pub fn classify(method: &Method, path: &str, query: Option<&str>) -> Option<Access> {
    let read_only = match *method {
        Method::GET | Method::HEAD => true,
        Method::PUT | Method::POST | Method::DELETE => false,
        _ => return None,
    };
    let live = *method == Method::GET
        && query
            .unwrap_or("")
            .split('&')
            .filter_map(|p| p.split_once('='))
            .any(|(k, v)| k == "live" && !v.is_empty());
    if let Some(name) = path.strip_prefix("/v1/stream/") {
        let class = class_of(method, read_only, live, false);
        return (!name.is_empty() && !name.contains("/__")).then(|| Access {
            bucket: "__compat_v1".to_owned(),
            class,
            read_only,
            live,
            stream: true,
        });
    }
    let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    if segs.iter().any(|s| s.is_empty() || s.starts_with("__")) {
        return None;
    }
    let bucket = (*segs.first()?).to_owned();
    let stream = match segs.len() {
        // `PUT /{bucket}`: AdministerBucket. A bucket's other routes are not in the table.
        1 if *method == Method::PUT => false,
        1 => return None,
        // `/{bucket}/streams` lists a bucket: not in the table.
        2 if segs[1] == "streams" => return None,
        // `/{b}/{s}`, `/{b}/{affinity}/{s}`, or a subresource of either.
        2..=6 => true,
        _ => return None,
    };
    // A third segment is a subresource or the stream of an affinity-form path; past that, a
    // subresource must come third or fourth.
    if segs.len() > 3 && !segs[2..4].iter().any(|s| SUBRESOURCES.contains(s)) {
        return None;
    }
    let sub = segs.len() > 2
        && segs[2..]
            .iter()
            .any(|s| *s != "append-batch" && SUBRESOURCES.contains(s));
    let class = if stream {
        class_of(method, read_only, live, sub)
    } else {
        Class::Admin
    };
    Some(Access {
        bucket,
        class,
        read_only,
        live,
        stream,
    })
}

/// A stream route's class: writes to the stream itself (not a subresource, not a delete)
/// append; an `append-batch` appends too.
fn class_of(method: &Method, read_only: bool, live: bool, sub: bool) -> Class {
    match (read_only, live) {
        (true, true) => Class::LiveRead,
        (true, false) => Class::Read,
        (false, _) if *method == Method::DELETE => Class::Admin,
        (false, _) if sub => Class::Admin,
        (false, _) => Class::Append,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(m: Method, path: &str) -> Option<(String, bool)> {
        classify(&m, path, None).map(|a| (a.bucket, a.read_only))
    }

    #[test]
    fn routes_classify_by_bucket_and_method() {
        let ro = |b: &str| Some((b.to_owned(), true));
        let rw = |b: &str| Some((b.to_owned(), false));
        assert_eq!(c(Method::PUT, "/tenant-a"), rw("tenant-a"));
        assert_eq!(c(Method::GET, "/tenant-a"), None);
        assert_eq!(c(Method::GET, "/tenant-a/streams"), None);
        assert_eq!(c(Method::PUT, "/tenant-a/s"), rw("tenant-a"));
        assert_eq!(c(Method::POST, "/tenant-a/s"), rw("tenant-a"));
        assert_eq!(c(Method::GET, "/tenant-a/s"), ro("tenant-a"));
        assert_eq!(c(Method::HEAD, "/tenant-a/s"), ro("tenant-a"));
        assert_eq!(c(Method::GET, "/tenant-a/s/bootstrap"), ro("tenant-a"));
        assert_eq!(c(Method::PUT, "/tenant-a/s/snapshot/12"), rw("tenant-a"));
        assert_eq!(
            c(Method::POST, "/tenant-a/s/snapshot/12/parts"),
            rw("tenant-a")
        );
        assert_eq!(
            c(Method::DELETE, "/tenant-a/s/snapshot/parts"),
            rw("tenant-a")
        );
        assert_eq!(c(Method::GET, "/tenant-a/aff/s"), ro("tenant-a"));
        assert_eq!(c(Method::GET, "/tenant-a/aff/s/snapshot/3"), ro("tenant-a"));
        assert_eq!(c(Method::GET, "/v1/stream/a/b"), ro("__compat_v1"));
        assert_eq!(c(Method::GET, "/__ursula/metrics"), None);
        assert_eq!(c(Method::GET, "/tenant-a/s/__ds/subscriptions/x"), None);
        assert_eq!(c(Method::GET, "/tenant-a/s/unknown/x/y"), None);
        assert_eq!(c(Method::PATCH, "/tenant-a/s"), None);
        assert_eq!(c(Method::GET, "/"), None);
        let live = classify(&Method::GET, "/t/s", Some("offset=-1&live=sse"));
        assert!(live.is_some_and(|a| a.live));
        let not_live = classify(&Method::GET, "/t/s", Some("offset=-1&live="));
        assert!(not_live.is_some_and(|a| !a.live));
        let class = |m: Method, p: &str, q: Option<&str>| classify(&m, p, q).map(|a| a.class);
        assert_eq!(class(Method::POST, "/t/s", None), Some(Class::Append));
        assert_eq!(class(Method::PUT, "/t/s", None), Some(Class::Append));
        assert_eq!(class(Method::PUT, "/t/aff/s", None), Some(Class::Append));
        assert_eq!(
            class(Method::GET, "/t/s", Some("live=sse")),
            Some(Class::LiveRead)
        );
        assert_eq!(class(Method::HEAD, "/t/s", None), Some(Class::Read));
        assert_eq!(class(Method::DELETE, "/t/s", None), Some(Class::Admin));
        assert_eq!(
            class(Method::PUT, "/t/s/retention/5", None),
            Some(Class::Admin)
        );
        assert_eq!(
            class(Method::PUT, "/t/s/snapshot/5", None),
            Some(Class::Admin)
        );
        assert_eq!(class(Method::PUT, "/t", None), Some(Class::Admin));
        assert_eq!(
            class(Method::POST, "/t/s/append-batch", None),
            Some(Class::Append)
        );
    }
}
