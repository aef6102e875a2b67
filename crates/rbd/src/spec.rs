//! `rbd:POOL/IMAGE[@SNAP][?conf=PATH&id=USER]`.

use std::path::PathBuf;

use thiserror::Error;

/// A parsed RBD backing spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RbdSpec {
    pub pool: String,
    pub image: String,
    /// A snapshot: the image as it was then, served read-only.
    pub snap: Option<String>,
    /// The ceph.conf to read; `None`: where librados looks by itself
    /// (`CEPH_CONF`, /etc/ceph/ceph.conf, ~/.ceph/config, ./ceph.conf).
    pub conf: Option<PathBuf>,
    /// The client's id as `--id` takes it (`admin` is `client.admin`).
    pub id: String,
}

#[derive(Debug, Error, PartialEq, Eq)]
#[error("{spec}: {why} (expected rbd:POOL/IMAGE[@SNAP][?conf=PATH&id=USER])")]
pub struct SpecError {
    spec: String,
    why: String,
}

/// The client id when the spec names none.
pub const DEFAULT_ID: &str = "admin";

/// True if `text` names an RBD backing store.
pub fn is_rbd_uri(text: &str) -> bool {
    text.starts_with("rbd:")
}

/// Ceph's names (pools, images, snapshots, client ids) go to C as
/// NUL-terminated strings; control characters are never meant.
fn plain(s: &str) -> bool {
    !s.chars().any(char::is_control)
}

impl RbdSpec {
    pub fn parse(spec: &str) -> Result<RbdSpec, SpecError> {
        let bad = |why: &str| SpecError { spec: spec.to_string(), why: why.to_string() };
        let rest = spec.strip_prefix("rbd:").ok_or_else(|| bad("not an rbd: spec"))?;
        let (path, query) = match rest.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (rest, None),
        };
        let (pool, image) = path.split_once('/').ok_or_else(|| bad("no /IMAGE after the pool"))?;
        let (image, snap) = match image.split_once('@') {
            Some((i, s)) => (i, Some(s)),
            None => (image, None),
        };
        if pool.is_empty() {
            return Err(bad("no pool before the /"));
        }
        if image.is_empty() {
            return Err(bad("no image after the pool"));
        }
        if image.contains('/') {
            return Err(bad("one / between pool and image (RADOS namespaces are not supported)"));
        }
        match snap {
            Some("") => return Err(bad("no snapshot name after the @")),
            Some(s) if s.contains('@') || s.contains('/') => {
                return Err(bad("a snapshot name has no @ or /"))
            }
            _ => {}
        }
        if pool.contains('@') {
            return Err(bad("a pool name has no @"));
        }
        if !plain(path) {
            return Err(bad("control characters in a name"));
        }
        let mut conf = None;
        let mut id = None;
        for pair in query.into_iter().flat_map(|q| q.split('&')).filter(|p| !p.is_empty()) {
            let (key, value) =
                pair.split_once('=').ok_or_else(|| bad(&format!("{pair:?} is not KEY=VALUE")))?;
            if value.is_empty() {
                return Err(bad(&format!("{key}= has no value")));
            }
            if !plain(value) {
                return Err(bad(&format!("control characters in {key}=")));
            }
            let slot = match key {
                "conf" => &mut conf,
                "id" => &mut id,
                other => {
                    return Err(bad(&format!("unknown query key {other:?}; the keys are conf= and id=")))
                }
            };
            if slot.replace(value.to_string()).is_some() {
                return Err(bad(&format!("{key}= given twice")));
            }
        }
        let id = id.unwrap_or_else(|| DEFAULT_ID.to_string());
        if let Some(user) = id.strip_prefix("client.") {
            return Err(bad(&format!("id= takes the id alone, as --id does: id={user}")));
        }
        Ok(RbdSpec {
            pool: pool.to_string(),
            image: image.to_string(),
            snap: snap.map(str::to_string),
            conf: conf.map(PathBuf::from),
            id,
        })
    }

    /// Read-only by its nature: a snapshot never changes.
    pub fn is_snapshot(&self) -> bool {
        self.snap.is_some()
    }
}

/// The spec without its query: `rbd:POOL/IMAGE[@SNAP]`, for logs and errors.
impl std::fmt::Display for RbdSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "rbd:{}/{}", self.pool, self.image)?;
        if let Some(s) = &self.snap {
            write!(f, "@{s}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_forms_parse() {
        let s = RbdSpec::parse("rbd:rbd/disk0").unwrap();
        assert_eq!(
            s,
            RbdSpec { pool: "rbd".into(), image: "disk0".into(), snap: None, conf: None, id: "admin".into() }
        );
        assert!(!s.is_snapshot());
        assert_eq!(s.to_string(), "rbd:rbd/disk0");
        let s = RbdSpec::parse("rbd:vms/db-1@nightly?conf=/etc/ceph/other.conf&id=arcache").unwrap();
        assert_eq!((s.pool.as_str(), s.image.as_str(), s.snap.as_deref()), ("vms", "db-1", Some("nightly")));
        assert_eq!(s.conf.as_deref(), Some(std::path::Path::new("/etc/ceph/other.conf")));
        assert_eq!(s.id, "arcache");
        assert!(s.is_snapshot());
        assert_eq!(s.to_string(), "rbd:vms/db-1@nightly");
        // Either key alone, in either order, and stray separators.
        assert_eq!(RbdSpec::parse("rbd:p/i?id=u").unwrap().id, "u");
        let s = RbdSpec::parse("rbd:p/i?&id=u&conf=c.conf&").unwrap();
        assert_eq!((s.id.as_str(), s.conf.unwrap()), ("u", PathBuf::from("c.conf")));
        assert!(is_rbd_uri("rbd:p/i") && !is_rbd_uri("s3://b/k") && !is_rbd_uri("/dev/rbd0"));
    }

    #[test]
    fn malformed_specs_say_what_is_wrong() {
        for (spec, why) in [
            ("s3://b/k", "not an rbd: spec"),
            ("rbd:", "no /IMAGE after the pool"),
            ("rbd:pool", "no /IMAGE after the pool"),
            ("rbd:/img", "no pool before the /"),
            ("rbd:pool/", "no image after the pool"),
            ("rbd:pool/@s", "no image after the pool"),
            ("rbd:pool/ns/img", "RADOS namespaces are not supported"),
            ("rbd:pool/img@", "no snapshot name after the @"),
            ("rbd:pool/img@a@b", "a snapshot name has no @ or /"),
            ("rbd:po@ol/img", "a pool name has no @"),
            ("rbd:pool/im\u{0}g", "control characters in a name"),
            ("rbd:pool/img?conf", "\"conf\" is not KEY=VALUE"),
            ("rbd:pool/img?conf=", "conf= has no value"),
            ("rbd:pool/img?id=a&id=b", "id= given twice"),
            ("rbd:pool/img?user=a", "unknown query key \"user\""),
            ("rbd:pool/img?id=client.admin", "id= takes the id alone, as --id does: id=admin"),
            ("rbd:pool/img?conf=/x\n", "control characters in conf="),
        ] {
            let e = RbdSpec::parse(spec).unwrap_err().to_string();
            assert!(e.contains(why), "{spec:?}: {e}");
            assert!(e.contains("expected rbd:POOL/IMAGE"), "{spec:?}: {e}");
        }
    }
}
