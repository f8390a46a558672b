//! The cluster manifest (`--config PATH`, cluster.md §10): which nodes exist and where their
//! admin and client planes listen. TOML or JSON by the file's extension; `-` reads JSON or
//! TOML from stdin (JSON if it starts with `{`).

use std::path::Path;

use serde::Deserialize;

use crate::CtlError;

/// The admin port a node entry without `admin_url` or `admin_port` gets.
pub const DEFAULT_ADMIN_PORT: u16 = 4438;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawManifest {
    nodes: Vec<RawNode>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNode {
    id: u64,
    host: Option<String>,
    admin_port: Option<u16>,
    admin_url: Option<String>,
    http_url: Option<String>,
}

/// One node of the manifest, with both URLs resolved (no trailing slash).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeEntry {
    pub id: u64,
    /// Mutating verbs go here (`server.admin_listen`).
    pub admin_url: String,
    /// Read-only metrics (`status`, `wait-ready`); the admin URL when not given.
    pub http_url: String,
}

/// The parsed manifest: nodes in the order given, unique ids.
#[derive(Debug, Clone)]
pub struct Manifest {
    pub nodes: Vec<NodeEntry>,
}

impl Manifest {
    /// Reads `path` (`-`: stdin).
    pub fn load(path: &Path) -> Result<Manifest, CtlError> {
        let (text, kind) = if path == Path::new("-") {
            let mut s = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut s)
                .map_err(|e| CtlError::config(format!("reading the manifest from stdin: {e}")))?;
            let kind = if s.trim_start().starts_with('{') {
                "json"
            } else {
                "toml"
            };
            (s, kind)
        } else {
            let kind = match path.extension().and_then(|e| e.to_str()) {
                Some("json") => "json",
                Some("toml") => "toml",
                other => {
                    return Err(CtlError::config(format!(
                        "manifest {}: unsupported extension {:?} (use .toml or .json)",
                        path.display(),
                        other.unwrap_or("")
                    )));
                }
            };
            let s = std::fs::read_to_string(path).map_err(|e| {
                CtlError::config(format!("reading manifest {}: {e}", path.display()))
            })?;
            (s, kind)
        };
        Manifest::parse(&text, kind)
            .map_err(|e| CtlError::config(format!("manifest {}: {e}", path.display())))
    }

    /// Parses manifest text; `kind` is `"json"` or `"toml"`.
    pub fn parse(text: &str, kind: &str) -> Result<Manifest, String> {
        let raw: RawManifest = match kind {
            "json" => serde_json::from_str(text).map_err(|e| e.to_string())?,
            _ => toml::from_str(text).map_err(|e| e.to_string().replace('\n', " "))?,
        };
        if raw.nodes.is_empty() {
            return Err("no nodes".into());
        }
        let mut nodes: Vec<NodeEntry> = Vec::with_capacity(raw.nodes.len());
        for n in raw.nodes {
            if n.id == 0 {
                return Err("node id 0 is not valid".into());
            }
            if nodes.iter().any(|e| e.id == n.id) {
                return Err(format!("node id {} appears twice", n.id));
            }
            let admin_url = match (&n.admin_url, &n.host) {
                (Some(u), _) => trim(u),
                (None, Some(h)) => {
                    format!("http://{h}:{}", n.admin_port.unwrap_or(DEFAULT_ADMIN_PORT))
                }
                (None, None) => {
                    return Err(format!("node {}: needs admin_url or host", n.id));
                }
            };
            for u in [Some(&admin_url), n.http_url.as_ref()]
                .into_iter()
                .flatten()
            {
                if !u.starts_with("http://") {
                    return Err(format!("node {}: {u:?} is not an http:// URL", n.id));
                }
            }
            let http_url = n
                .http_url
                .as_deref()
                .map_or_else(|| admin_url.clone(), trim);
            nodes.push(NodeEntry {
                id: n.id,
                admin_url,
                http_url,
            });
        }
        Ok(Manifest { nodes })
    }

    /// The entry of node `id`.
    pub fn node(&self, id: u64) -> Result<&NodeEntry, CtlError> {
        self.nodes
            .iter()
            .find(|n| n.id == id)
            .ok_or_else(|| CtlError::config(format!("node {id} is not in the manifest")))
    }
}

fn trim(u: &str) -> String {
    u.trim_end_matches('/').to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_and_json_resolve_urls() {
        let t = "[[nodes]]\nid = 1\nhost = \"10.0.0.1\"\n\
                 [[nodes]]\nid = 2\nhost = \"10.0.0.2\"\nadmin_port = 9000\nhttp_url = \"http://10.0.0.2:4437/\"\n\
                 [[nodes]]\nid = 3\nadmin_url = \"http://127.0.0.1:5000\"\n";
        let m = Manifest::parse(t, "toml").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(m.nodes[0].admin_url, "http://10.0.0.1:4438");
        assert_eq!(m.nodes[0].http_url, "http://10.0.0.1:4438");
        assert_eq!(m.nodes[1].admin_url, "http://10.0.0.2:9000");
        assert_eq!(m.nodes[1].http_url, "http://10.0.0.2:4437");
        assert_eq!(m.nodes[2].admin_url, "http://127.0.0.1:5000");
        let j = r#"{"nodes":[{"id":7,"admin_url":"http://h:1","http_url":"http://h:2"}]}"#;
        let m = Manifest::parse(j, "json").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(m.nodes[0].http_url, "http://h:2");
    }

    #[test]
    fn bad_manifests_are_refused() {
        for (text, why) in [
            ("nodes = []", "no nodes"),
            ("[[nodes]]\nid = 1\n", "needs admin_url or host"),
            ("[[nodes]]\nid = 0\nhost = \"h\"\n", "id 0"),
            (
                "[[nodes]]\nid = 1\nhost = \"h\"\n[[nodes]]\nid = 1\nhost = \"g\"\n",
                "twice",
            ),
            (
                "[[nodes]]\nid = 1\nadmin_url = \"https://h\"\n",
                "not an http://",
            ),
            (
                "[[nodes]]\nid = 1\nhost = \"h\"\nport = 3\n",
                "unknown field",
            ),
        ] {
            let e = Manifest::parse(text, "toml").err().unwrap_or_default();
            assert!(e.contains(why), "{text:?}: {e}");
        }
    }
}
