//! A small HTTP/1.1 client for the nodes' JSON endpoints (plain `http://`, the admin plane is
//! reached through a tunnel, never over TLS). Every request is bounded by a timeout.

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as Legacy;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// Bound on one request, connecting and reading the whole answer included.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest answer read (metrics of a node with many groups stay far below it).
const MAX_BODY: usize = 64 << 20;

/// A node's answer: status and body parsed as JSON (`Null` if it is not JSON).
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub json: serde_json::Value,
    /// The body as text (for error messages).
    pub text: String,
}

impl Answer {
    /// `error.code` of a JSON error body, if any.
    pub fn error_code(&self) -> Option<&str> {
        self.json["error"]["code"].as_str()
    }

    /// `error.message` of a JSON error body, else the body itself (shortened).
    pub fn error_message(&self) -> String {
        match self.json["error"]["message"].as_str() {
            Some(m) => m.to_owned(),
            None => self
                .text
                .chars()
                .take(200)
                .collect::<String>()
                .replace('\n', " "),
        }
    }
}

/// Shared connection pool.
#[derive(Clone)]
pub struct Client {
    inner: Legacy<HttpConnector, Full<Bytes>>,
}

impl Default for Client {
    fn default() -> Self {
        let mut conn = HttpConnector::new();
        conn.set_connect_timeout(Some(Duration::from_secs(2)));
        conn.set_nodelay(true);
        Client {
            inner: Legacy::builder(TokioExecutor::new()).build(conn),
        }
    }
}

impl Client {
    /// `method url` with an empty body; `Err` names the transport failure.
    pub async fn call(&self, method: Method, url: &str) -> Result<Answer, String> {
        let uri: http::Uri = url.parse().map_err(|e| format!("bad URL {url}: {e}"))?;
        let mut req = Request::new(Full::new(Bytes::new()));
        *req.method_mut() = method;
        *req.uri_mut() = uri;
        req.headers_mut().insert(
            http::header::ACCEPT,
            http::HeaderValue::from_static("application/json"),
        );
        let work = async {
            let resp = self.inner.request(req).await.map_err(|e| describe(&e))?;
            let status = resp.status().as_u16();
            let body = http_body_util::Limited::new(resp.into_body(), MAX_BODY)
                .collect()
                .await
                .map_err(|e| format!("reading the answer: {e}"))?
                .to_bytes();
            let text = String::from_utf8_lossy(&body).into_owned();
            let json = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
            Ok(Answer { status, json, text })
        };
        tokio::time::timeout(REQUEST_TIMEOUT, work)
            .await
            .map_err(|_| format!("no answer within {} s", REQUEST_TIMEOUT.as_secs()))?
    }

    /// `GET url`, requiring a `200` JSON answer.
    pub async fn get_json(&self, url: &str) -> Result<serde_json::Value, String> {
        let a = self.call(Method::GET, url).await?;
        if a.status != 200 {
            return Err(format!("HTTP {}: {}", a.status, a.error_message()));
        }
        if a.json.is_null() {
            return Err("the answer is not JSON".into());
        }
        Ok(a.json)
    }
}

/// The innermost cause of a client error (hyper-util wraps the connect error).
fn describe(e: &hyper_util::client::legacy::Error) -> String {
    let mut msg = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        msg = s.to_string();
        src = s.source();
    }
    msg
}
