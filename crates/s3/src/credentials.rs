//! Where credentials, region and endpoint come from, as every S3 tool
//! takes them: settings given for the export first, then the environment
//! (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`,
//! `AWS_REGION`, `AWS_ENDPOINT_URL`), then the shared credentials file
//! (`AWS_SHARED_CREDENTIALS_FILE`, else `~/.aws/credentials`) at the
//! profile `AWS_PROFILE` names, else `default`.

use std::collections::HashMap;
use std::path::PathBuf;

/// What one export may set for itself (the config file's per-export keys);
/// anything left `None` comes from the environment or the profile.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct S3Settings {
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
    pub session_token: Option<String>,
    pub region: Option<String>,
    pub endpoint: Option<String>,
    pub profile: Option<String>,
}

#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: Option<String>,
    pub region: String,
    /// A custom endpoint (then requests use path-style addressing).
    pub endpoint: Option<String>,
    /// Where the keys came from, for messages (never the keys).
    pub source: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Credentials {{ key id {}, region {}, endpoint {:?}, from {} }}",
            self.access_key_id, self.region, self.endpoint, self.source
        )
    }
}

const DEFAULT_REGION: &str = "us-east-1";

impl S3Settings {
    /// Resolves with the process environment and the home directory.
    pub fn resolve(&self) -> Result<Credentials, String> {
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let file = env("AWS_SHARED_CREDENTIALS_FILE")
            .map(PathBuf::from)
            .or_else(|| env("HOME").map(|h| PathBuf::from(h).join(".aws/credentials")));
        let text = file.as_ref().and_then(|f| std::fs::read_to_string(f).ok());
        self.resolve_with(&env, text.as_deref(), file.map(|f| f.display().to_string()).unwrap_or_default())
    }

    fn resolve_with(
        &self,
        env: &dyn Fn(&str) -> Option<String>,
        credentials_file: Option<&str>,
        file_name: String,
    ) -> Result<Credentials, String> {
        let region = self.region.clone().or_else(|| env("AWS_REGION")).or_else(|| env("AWS_DEFAULT_REGION"));
        let endpoint = self.endpoint.clone().or_else(|| env("AWS_ENDPOINT_URL"));
        let region = region.unwrap_or_else(|| DEFAULT_REGION.to_string());
        if let (Some(id), Some(secret)) = (&self.access_key_id, &self.secret_access_key) {
            return Ok(Credentials {
                access_key_id: id.clone(),
                secret_access_key: secret.clone(),
                session_token: self.session_token.clone(),
                region,
                endpoint,
                source: "the export's settings".into(),
            });
        }
        // An explicit profile wins over keys in the environment, as with
        // the AWS CLI's --profile.
        let profile = self.profile.clone().or_else(|| env("AWS_PROFILE"));
        if profile.is_none() {
            if let (Some(id), Some(secret)) = (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY")) {
                return Ok(Credentials {
                    access_key_id: id,
                    secret_access_key: secret,
                    session_token: env("AWS_SESSION_TOKEN"),
                    region,
                    endpoint,
                    source: "the environment (AWS_ACCESS_KEY_ID)".into(),
                });
            }
        }
        let name = profile.unwrap_or_else(|| "default".into());
        let sections = credentials_file.map(parse_ini).unwrap_or_default();
        let Some(p) = sections.get(&name) else {
            return Err(format!(
                "no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or a [{name}] profile in {}",
                if file_name.is_empty() { "~/.aws/credentials".into() } else { file_name }
            ));
        };
        let get = |k: &str| p.get(k).cloned().filter(|v| !v.is_empty());
        match (get("aws_access_key_id"), get("aws_secret_access_key")) {
            (Some(id), Some(secret)) => Ok(Credentials {
                access_key_id: id,
                secret_access_key: secret,
                session_token: get("aws_session_token"),
                region: self.region.clone().or_else(|| get("region")).unwrap_or(region),
                endpoint: endpoint.or_else(|| get("endpoint_url")),
                source: format!("profile [{name}] of {file_name}"),
            }),
            _ => Err(format!(
                "profile [{name}] of {file_name} lacks aws_access_key_id or aws_secret_access_key"
            )),
        }
    }
}

/// `[section]` and `key = value` lines; `#` and `;` start comments.
fn parse_ini(text: &str) -> HashMap<String, HashMap<String, String>> {
    let mut out: HashMap<String, HashMap<String, String>> = HashMap::new();
    let mut current: Option<String> = None;
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            // ~/.aws/config writes "[profile x]"; the credentials file "[x]".
            let name = name.trim().strip_prefix("profile ").unwrap_or(name.trim()).to_string();
            out.entry(name.clone()).or_default();
            current = Some(name);
        } else if let (Some(sec), Some((k, v))) = (&current, line.split_once('=')) {
            out.entry(sec.clone()).or_default().insert(k.trim().to_string(), v.trim().to_string());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "[default]\naws_access_key_id = DEF\naws_secret_access_key = defsecret\n\n\
                        # a comment\n[work]\naws_access_key_id=WORK\naws_secret_access_key=worksecret\nregion = eu-west-1\n";

    fn env_of(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    }

    #[test]
    fn the_environment_comes_before_the_default_profile() {
        let env = env_of(&[
            ("AWS_ACCESS_KEY_ID", "ENV"),
            ("AWS_SECRET_ACCESS_KEY", "s"),
            ("AWS_ENDPOINT_URL", "http://127.0.0.1:9000"),
        ]);
        let c = S3Settings::default().resolve_with(&env, Some(FILE), "f".into()).unwrap();
        assert_eq!((c.access_key_id.as_str(), c.region.as_str()), ("ENV", "us-east-1"));
        assert_eq!(c.endpoint.as_deref(), Some("http://127.0.0.1:9000"));
        let c = S3Settings::default().resolve_with(&env_of(&[]), Some(FILE), "f".into()).unwrap();
        assert_eq!(c.access_key_id, "DEF");
    }

    #[test]
    fn a_named_profile_and_the_exports_own_keys() {
        let env =
            env_of(&[("AWS_PROFILE", "work"), ("AWS_ACCESS_KEY_ID", "ENV"), ("AWS_SECRET_ACCESS_KEY", "s")]);
        let c = S3Settings::default().resolve_with(&env, Some(FILE), "f".into()).unwrap();
        assert_eq!((c.access_key_id.as_str(), c.region.as_str()), ("WORK", "eu-west-1"));
        let own = S3Settings {
            access_key_id: Some("OWN".into()),
            secret_access_key: Some("SECRETVALUE".into()),
            region: Some("ap-south-1".into()),
            ..Default::default()
        };
        let c = own.resolve_with(&env, Some(FILE), "f".into()).unwrap();
        assert_eq!((c.access_key_id.as_str(), c.region.as_str()), ("OWN", "ap-south-1"));
        assert!(!format!("{c:?}").contains("SECRETVALUE"), "the secret never shows: {c:?}");
    }

    #[test]
    fn missing_credentials_are_a_clear_error() {
        let e = S3Settings::default().resolve_with(&env_of(&[]), None, String::new()).unwrap_err();
        assert!(e.contains("AWS_ACCESS_KEY_ID") && e.contains("[default]"), "{e}");
        let env = env_of(&[("AWS_PROFILE", "nope")]);
        let e = S3Settings::default().resolve_with(&env, Some(FILE), "f".into()).unwrap_err();
        assert!(e.contains("[nope]"), "{e}");
    }
}
