//! Access tokens (cluster.md §12.3): RFC 9068 JWT access tokens from one issuer, verified with
//! the issuer's JWKS, whose keys are cached by `kid`.

use crate::policy::Principal;
use http::HeaderMap;
use http::header;
use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The algorithms accepted (no HMAC: the gateway holds no shared secret).
const ALGORITHMS: [Algorithm; 8] = [
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::ES256,
    Algorithm::ES384,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
];
/// An unknown `kid` refetches the JWKS at most this often.
const REFETCH_EVERY: Duration = Duration::from_secs(30);
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
const LEEWAY_S: u64 = 60;

/// Why a request was not authenticated.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// `401`: a malformed, invalid or expired token.
    Invalid(String),
    /// `503`: the issuer's keys could not be fetched.
    Unavailable(String),
}

/// Who sent a request with a valid token, and until when it is valid.
#[derive(Debug, Clone)]
pub struct Credential {
    pub principal: Principal,
    /// `exp`, in seconds since the Unix epoch.
    pub expires_at: u64,
}

#[derive(Deserialize)]
struct Claims {
    iss: String,
    sub: String,
    #[allow(dead_code, reason = "required (RFC 9068), not used")]
    client_id: String,
    #[allow(dead_code, reason = "required (RFC 9068), not used")]
    iat: u64,
    exp: u64,
    #[allow(dead_code, reason = "required (RFC 9068), not used")]
    jti: String,
}

#[derive(Default)]
struct Keys {
    by_kid: HashMap<String, DecodingKey>,
    fetched: Option<Instant>,
}

pub struct Auth {
    issuer: String,
    audience: String,
    jwks_url: Option<String>,
    keys: Mutex<Keys>,
    http: reqwest::Client,
}

/// The bearer token of `hm`: `Ok(None)` without `Authorization`, an error for anything but
/// exactly one `Bearer` header with a non-empty token without whitespace.
pub fn bearer(hm: &HeaderMap) -> Result<Option<&str>, Refused> {
    let mut all = hm.get_all(header::AUTHORIZATION).iter();
    let Some(v) = all.next() else {
        return Ok(None);
    };
    let bad = |why: &str| Refused::Invalid(why.to_owned());
    if all.next().is_some() {
        return Err(bad("more than one Authorization header"));
    }
    let v = v
        .to_str()
        .map_err(|_| bad("an Authorization header that is not text"))?;
    let (scheme, token) = v.split_once(' ').ok_or_else(|| bad("not a Bearer token"))?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(bad("not a Bearer token"));
    }
    if token.is_empty() || token.chars().any(char::is_whitespace) {
        return Err(bad("an empty or malformed Bearer token"));
    }
    Ok(Some(token))
}

impl Auth {
    pub fn new(issuer: String, audience: String, jwks_url: Option<String>) -> Result<Auth, String> {
        let http = reqwest::Client::builder()
            .timeout(FETCH_TIMEOUT)
            .build()
            .map_err(|e| format!("cannot build the JWKS client: {e}"))?;
        Ok(Auth {
            issuer,
            audience,
            jwks_url,
            keys: Mutex::default(),
            http,
        })
    }

    /// Verifies `token`: type `at+jwt`, an accepted algorithm, a key of the issuer's, the
    /// issuer, audience and required claims, with 60 s of leeway.
    pub async fn verify(&self, token: &str) -> Result<Credential, Refused> {
        let invalid = |why: String| Refused::Invalid(why);
        let head =
            jsonwebtoken::decode_header(token).map_err(|e| invalid(format!("not a JWT: {e}")))?;
        let typ = head.typ.as_deref().map(str::to_ascii_lowercase);
        if !matches!(typ.as_deref(), Some("at+jwt" | "application/at+jwt")) {
            return Err(invalid(
                "not an access token (typ must be at+jwt)".to_owned(),
            ));
        }
        if !ALGORITHMS.contains(&head.alg) {
            return Err(invalid(format!("algorithm {:?} is not accepted", head.alg)));
        }
        let kid = head
            .kid
            .ok_or_else(|| invalid("the token names no key (kid)".to_owned()))?;
        let key = self
            .key(&kid)
            .await?
            .ok_or_else(|| invalid(format!("the issuer has no key {kid:?}")))?;
        let mut v = Validation::new(head.alg);
        v.set_issuer(&[&self.issuer]);
        v.set_audience(&[&self.audience]);
        v.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        v.leeway = LEEWAY_S;
        let data = jsonwebtoken::decode::<Claims>(token, &key, &v)
            .map_err(|e| invalid(format!("invalid token: {e}")))?;
        let c = data.claims;
        Ok(Credential {
            principal: Principal {
                issuer: c.iss,
                subject: c.sub,
            },
            expires_at: c.exp,
        })
    }

    /// The key `kid`, fetching the JWKS when it is not cached (at most every 30 s).
    async fn key(&self, kid: &str) -> Result<Option<DecodingKey>, Refused> {
        let recent = {
            let k = self.lock();
            if let Some(key) = k.by_kid.get(kid) {
                return Ok(Some(key.clone()));
            }
            k.fetched.is_some_and(|t| t.elapsed() < REFETCH_EVERY)
        };
        if recent {
            return Ok(None);
        }
        let set = self.fetch().await.map_err(Refused::Unavailable)?;
        let mut k = self.lock();
        k.fetched = Some(Instant::now());
        k.by_kid = set
            .keys
            .iter()
            .filter_map(|j| Some((j.common.key_id.clone()?, DecodingKey::from_jwk(j).ok()?)))
            .collect();
        Ok(k.by_kid.get(kid).cloned())
    }

    async fn fetch(&self) -> Result<JwkSet, String> {
        let url = match &self.jwks_url {
            Some(u) => u.clone(),
            None => {
                let meta: serde_json::Value = self.get_json(&discovery_url(&self.issuer)).await?;
                meta["jwks_uri"]
                    .as_str()
                    .ok_or("the issuer's metadata has no jwks_uri")?
                    .to_owned()
            }
        };
        let set = self.get_json(&url).await?;
        serde_json::from_value(set).map_err(|e| format!("the JWKS at {url} is malformed: {e}"))
    }

    async fn get_json(&self, url: &str) -> Result<serde_json::Value, String> {
        let fail = |e: reqwest::Error| format!("GET {url}: {e}");
        let r = self.http.get(url).send().await.map_err(fail)?;
        let r = r.error_for_status().map_err(fail)?;
        let body = r.bytes().await.map_err(fail)?;
        serde_json::from_slice(&body).map_err(|e| format!("GET {url}: not JSON: {e}"))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Keys> {
        self.keys.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// RFC 8414 §3: the well-known segment goes between the host and the issuer's path.
fn discovery_url(issuer: &str) -> String {
    let issuer = issuer.trim_end_matches('/');
    let scheme_end = issuer.find("://").map_or(0, |i| i + 3);
    match issuer[scheme_end..].find('/') {
        Some(i) => {
            let (host, path) = issuer.split_at(scheme_end + i);
            format!("{host}/.well-known/oauth-authorization-server{path}")
        }
        None => format!("{issuer}/.well-known/oauth-authorization-server"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn only_one_well_formed_bearer_token_is_taken() {
        let mut hm = HeaderMap::new();
        assert_eq!(bearer(&hm), Ok(None));
        hm.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("bEaReR abc.def.ghi"),
        );
        assert_eq!(bearer(&hm), Ok(Some("abc.def.ghi")));
        for bad in ["Basic abc", "Bearer ", "Bearer a b", "Bearer"] {
            hm.insert(header::AUTHORIZATION, HeaderValue::from_static(bad));
            assert!(bearer(&hm).is_err(), "{bad}");
        }
        hm.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer a"));
        hm.append(header::AUTHORIZATION, HeaderValue::from_static("Bearer b"));
        assert!(bearer(&hm).is_err(), "two headers");
    }

    #[test]
    fn discovery_puts_the_well_known_segment_before_the_issuers_path() {
        assert_eq!(
            discovery_url("https://issuer.example"),
            "https://issuer.example/.well-known/oauth-authorization-server"
        );
        assert_eq!(
            discovery_url("https://h.example/tenant/1/"),
            "https://h.example/.well-known/oauth-authorization-server/tenant/1"
        );
    }
}
