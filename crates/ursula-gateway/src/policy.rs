//! The bucket policy (cluster.md §12.4): who owns a bucket, and whether anyone may read it.
//! Owners may do everything in their bucket; anyone, anonymous included, may do read-only
//! actions on a `public_read` bucket; everything else is concealed as a missing resource.

use serde::Deserialize;
use std::collections::{HashMap, HashSet};
use std::path::Path;

/// A principal: the issuer-qualified subject of an access token.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Principal {
    pub issuer: String,
    pub subject: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    bucket: Vec<Rule>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Rule {
    id: String,
    #[serde(default)]
    public_read: bool,
    #[serde(default)]
    owners: Vec<Principal>,
}

#[derive(Debug, Default)]
struct Bucket {
    public_read: bool,
    owners: HashSet<Principal>,
}

/// A loaded policy file.
#[derive(Debug, Default)]
pub struct Policy(HashMap<String, Bucket>);

impl Policy {
    pub fn load(path: &Path) -> Result<Policy, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the policy {}: {e}", path.display()))?;
        Policy::parse(&text).map_err(|e| format!("policy {}: {e}", path.display()))
    }

    /// Parses a policy; unknown fields, empty ids and a bucket named twice are errors.
    pub fn parse(text: &str) -> Result<Policy, String> {
        let file: File = toml::from_str(text).map_err(|e| e.to_string())?;
        let mut buckets = HashMap::new();
        for r in file.bucket {
            if r.id.trim().is_empty() {
                return Err("a bucket with an empty id".to_owned());
            }
            if r.owners
                .iter()
                .any(|o| o.issuer.is_empty() || o.subject.is_empty())
            {
                return Err(format!(
                    "bucket {:?}: an owner with an empty issuer or subject",
                    r.id
                ));
            }
            let b = Bucket {
                public_read: r.public_read,
                owners: r.owners.into_iter().collect(),
            };
            if buckets.insert(r.id.clone(), b).is_some() {
                return Err(format!("bucket {:?} is listed twice", r.id));
            }
        }
        Ok(Policy(buckets))
    }

    /// Whether `who` (`None`: anonymous) may do an action on `bucket`.
    pub fn allows(&self, bucket: &str, read_only: bool, who: Option<&Principal>) -> bool {
        let Some(b) = self.0.get(bucket) else {
            return false;
        };
        who.is_some_and(|p| b.owners.contains(p)) || (read_only && b.public_read)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: &str = r#"
[[bucket]]
id = "tenant-a"
public_read = true
owners = [{ issuer = "https://issuer.example", subject = "user-1" }]

[[bucket]]
id = "tenant-b"
owners = [{ issuer = "https://issuer.example", subject = "user-2" }]
"#;

    fn who(sub: &str) -> Principal {
        Principal {
            issuer: "https://issuer.example".to_owned(),
            subject: sub.to_owned(),
        }
    }

    #[test]
    fn owners_do_everything_and_the_public_only_reads_public_buckets() {
        let p = Policy::parse(POLICY).unwrap_or_default();
        assert!(p.allows("tenant-a", false, Some(&who("user-1"))));
        assert!(p.allows("tenant-a", true, None), "public read");
        assert!(!p.allows("tenant-a", false, None));
        assert!(!p.allows("tenant-a", false, Some(&who("user-2"))));
        assert!(!p.allows("tenant-b", true, None), "private");
        assert!(!p.allows("tenant-b", true, Some(&who("user-1"))));
        assert!(p.allows("tenant-b", true, Some(&who("user-2"))));
        let other_issuer = Principal {
            issuer: "https://other.example".to_owned(),
            subject: "user-2".to_owned(),
        };
        assert!(!p.allows("tenant-b", false, Some(&other_issuer)));
        assert!(!p.allows("unknown", true, Some(&who("user-1"))));
    }

    #[test]
    fn a_malformed_policy_is_refused() {
        for bad in [
            "[[bucket]]\nid = \"\"\n",
            "[[bucket]]\nid = \"a\"\n[[bucket]]\nid = \"a\"\n",
            "[[bucket]]\nid = \"a\"\nbogus = 1\n",
            "[[bucket]]\nid = \"a\"\nowners = [{ issuer = \"i\" }]\n",
            "[[bucket]]\nid = \"a\"\nowners = [{ issuer = \"\", subject = \"s\" }]\n",
        ] {
            assert!(Policy::parse(bad).is_err(), "{bad}");
        }
    }
}
