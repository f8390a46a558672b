//! A live answer authorized by a credential ends when the credential does (cluster.md §12.5):
//! the gateway sends a `credential-expired` event and stops reading upstream. The client
//! re-authenticates and resumes from the last `streamNextOffset`.

use crate::answer::Body;
use bytes::Bytes;
use futures::StreamExt;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const EXPIRED: &[u8] = b"event: credential-expired\ndata:{\"reason\":\"credential_expired\"}\n\n";

/// `body`, cut at `expires_at` (seconds since the Unix epoch) with the expiry event.
pub fn until(body: Body, expires_at: u64) -> Body {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let left = Duration::from_secs(expires_at).saturating_sub(now);
    let deadline = Box::pin(tokio::time::sleep(left));
    let frames = futures::stream::unfold(Some((body, deadline)), |state| async move {
        let (mut body, mut deadline) = state?;
        tokio::select! {
            frame = body.frame() => {
                let frame = frame?;
                Some((frame, Some((body, deadline))))
            }
            () = &mut deadline => {
                Some((Ok(Frame::data(Bytes::from_static(EXPIRED))), None))
            }
        }
    });
    BodyExt::boxed_unsync(StreamBody::new(frames.boxed()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    #[tokio::test]
    async fn an_expired_credential_ends_the_stream_with_its_event() {
        // An upstream body that never ends.
        let (_tx, rx) = futures::channel::mpsc::channel::<Result<Frame<Bytes>, hyper::Error>>(1);
        let open: Body = BodyExt::boxed_unsync(StreamBody::new(rx));
        let past = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs()
            - 1;
        let got = tokio::time::timeout(Duration::from_secs(5), until(open, past).collect())
            .await
            .expect("ends at once")
            .unwrap()
            .to_bytes();
        assert_eq!(&got[..], EXPIRED);
    }
}
