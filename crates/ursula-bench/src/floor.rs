//! The floor: an HTTP/1.1 server that reads each request body and answers
//! 204 with nothing else. Whatever a real server does costs more than this,
//! so it bounds what the load generator and the kernel can do on a machine.

use std::convert::Infallible;
use std::net::SocketAddr;

use anyhow::{Context, Result};
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

async fn answer(req: Request<Incoming>) -> Result<Response<Empty<Bytes>>, Infallible> {
    let mut body = req.into_body();
    while let Some(frame) = body.frame().await {
        if frame.is_err() {
            break;
        }
    }
    let mut resp = Response::new(Empty::new());
    *resp.status_mut() = StatusCode::NO_CONTENT;
    Ok(resp)
}

/// Bind and serve until the process is killed.
pub async fn serve(listen: SocketAddr) -> Result<()> {
    let listener = TcpListener::bind(listen)
        .await
        .with_context(|| format!("binding {listen}"))?;
    serve_on(listener).await
}

pub async fn serve_on(listener: TcpListener) -> Result<()> {
    crate::report::note(&format!(
        "floor listening on http://{}",
        listener.local_addr()?
    ));
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(x) => x,
            Err(_) => {
                // Out of file descriptors and the like: back off briefly.
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        tokio::spawn(async move {
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service_fn(answer))
                .await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::{Conn, Endpoint};
    use crate::target::{Layout, Target};

    #[tokio::test]
    async fn answers_204_and_keeps_alive() -> Result<()> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let server = tokio::spawn(serve_on(listener));
        let target = Target::parse(&format!("http://{addr}"), Layout::Native, "b")?;
        let ep = Endpoint::resolve(target).await?;
        let mut conn = Conn::new(ep.clone());
        for _ in 0..3 {
            let uri = ep.target.stream_uri("s")?;
            let req = || {
                ep.request(
                    http::Method::POST,
                    uri.clone(),
                    Bytes::from_static(b"hello"),
                )
            };
            let (parts, n) = conn.send_drain(req).await?;
            assert_eq!(parts.status, StatusCode::NO_CONTENT);
            assert_eq!(n, 0);
        }
        assert_eq!(conn.connects(), 1);
        server.abort();
        Ok(())
    }
}
