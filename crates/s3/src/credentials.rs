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
#[derive(Clone, Default, PartialEq, Eq)]
pub struct S3Settings {
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
    pub session_token: Option<String>,
    pub region: Option<String>,
    pub endpoint: Option<String>,
    pub profile: Option<String>,
    /// How long one request is retried before it fails its client request
    /// (the config key `s3_retry_timeout_secs`); a URI's `retry_timeout=`
    /// wins.
    pub retry_timeout: Option<std::time::Duration>,
}

// Never the secrets: settings end up in debug logs of the whole config.
impl std::fmt::Debug for S3Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let set = |v: &Option<String>| if v.is_some() { "set" } else { "-" };
        write!(
            f,
            "S3Settings {{ key id {:?}, secret {}, token {}, region {:?}, endpoint {:?}, profile {:?}, retry {:?} }}",
            self.access_key_id,
            set(&self.secret_access_key),
            set(&self.session_token),
            self.region,
            self.endpoint,
            self.profile,
            self.retry_timeout
        )
    }
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

/// The AWS tools' two files, as read: the shared credentials file and the
/// config file (`region`, `endpoint_url` per profile).
#[derive(Default)]
struct AwsFiles {
    credentials: Option<String>,
    credentials_name: String,
    config: Option<String>,
}

impl S3Settings {
    /// Resolves with the process environment and the home directory.
    pub fn resolve(&self) -> Result<Credentials, String> {
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let home_file = |var: &str, name: &str| {
            env(var)
                .map(PathBuf::from)
                .or_else(|| env("HOME").map(|h| PathBuf::from(h).join(".aws").join(name)))
        };
        let creds = home_file("AWS_SHARED_CREDENTIALS_FILE", "credentials");
        let config = home_file("AWS_CONFIG_FILE", "config");
        let files = AwsFiles {
            credentials: creds.as_ref().and_then(|f| std::fs::read_to_string(f).ok()),
            credentials_name: creds.map(|f| f.display().to_string()).unwrap_or_default(),
            config: config.as_ref().and_then(|f| std::fs::read_to_string(f).ok()),
        };
        self.resolve_with(&env, &files)
    }

    fn resolve_with(
        &self,
        env: &dyn Fn(&str) -> Option<String>,
        files: &AwsFiles,
    ) -> Result<Credentials, String> {
        // An explicit profile wins over keys in the environment, as with
        // the AWS CLI's --profile.
        let named = self.profile.clone().or_else(|| env("AWS_PROFILE"));
        let name = named.clone().unwrap_or_else(|| "default".into());
        let sections = files.credentials.as_deref().map(parse_ini).unwrap_or_default();
        let in_creds = sections.get(&name);
        let config = files.config.as_deref().map(parse_ini).unwrap_or_default();
        // `parse_ini` takes "[profile x]" as "x".
        let in_config = config.get(&name);
        let from_files = |k: &str| {
            let get = |m: Option<&HashMap<String, String>>| {
                m.and_then(|p| p.get(k)).filter(|v| !v.is_empty()).cloned()
            };
            get(in_config).or_else(|| get(in_creds))
        };
        let region = self
            .region
            .clone()
            .or_else(|| env("AWS_REGION"))
            .or_else(|| env("AWS_DEFAULT_REGION"))
            .or_else(|| from_files("region"))
            .unwrap_or_else(|| DEFAULT_REGION.to_string());
        let endpoint = self
            .endpoint
            .clone()
            .or_else(|| env("AWS_ENDPOINT_URL_S3"))
            .or_else(|| env("AWS_ENDPOINT_URL"))
            .or_else(|| from_files("endpoint_url"));
        let made = |id: String, secret: String, token: Option<String>, source: String| Credentials {
            access_key_id: id,
            secret_access_key: secret,
            session_token: token,
            region: region.clone(),
            endpoint: endpoint.clone(),
            source,
        };
        // The key id and the secret come as a pair from one place, never
        // mixed from two.
        match (&self.access_key_id, &self.secret_access_key) {
            (Some(id), Some(secret)) => {
                return Ok(made(
                    id.clone(),
                    secret.clone(),
                    self.session_token.clone(),
                    "the export's settings".into(),
                ))
            }
            (Some(_), None) => return Err("s3_access_key_id is set without s3_secret_access_key".into()),
            (None, Some(_)) => return Err("s3_secret_access_key is set without s3_access_key_id".into()),
            (None, None) => {}
        }
        if named.is_none() {
            if let (Some(id), Some(secret)) = (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY")) {
                let source = "the environment (AWS_ACCESS_KEY_ID)".to_string();
                return Ok(made(id, secret, env("AWS_SESSION_TOKEN"), source));
            }
        }
        let file_name = if files.credentials_name.is_empty() {
            "~/.aws/credentials"
        } else {
            files.credentials_name.as_str()
        };
        let Some(p) = in_creds else {
            return Err(format!(
                "no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or a [{name}] profile in {file_name}"
            ));
        };
        let get = |k: &str| p.get(k).cloned().filter(|v| !v.is_empty());
        match (get("aws_access_key_id"), get("aws_secret_access_key")) {
            (Some(id), Some(secret)) => {
                Ok(made(id, secret, get("aws_session_token"), format!("profile [{name}] of {file_name}")))
            }
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

    fn files(credentials: &str) -> AwsFiles {
        AwsFiles { credentials: Some(credentials.into()), credentials_name: "f".into(), config: None }
    }

    #[test]
    fn region_and_endpoint_come_from_the_config_file_and_keys_come_in_pairs() {
        let mut f = files(FILE);
        f.config = Some(
            "[default]\nregion = eu-north-1\n[profile work]\nregion = sa-east-1\nendpoint_url = http://w:1\n"
                .into(),
        );
        let c = S3Settings::default().resolve_with(&env_of(&[]), &f).unwrap();
        assert_eq!((c.access_key_id.as_str(), c.region.as_str()), ("DEF", "eu-north-1"));
        let work = S3Settings { profile: Some("work".into()), ..Default::default() };
        let c = work.resolve_with(&env_of(&[]), &f).unwrap();
        assert_eq!((c.region.as_str(), c.endpoint.as_deref()), ("sa-east-1", Some("http://w:1")));
        let env = env_of(&[("AWS_REGION", "us-west-2"), ("AWS_ENDPOINT_URL_S3", "http://s3:2")]);
        let c = work.resolve_with(&env, &f).unwrap();
        assert_eq!((c.region.as_str(), c.endpoint.as_deref()), ("us-west-2", Some("http://s3:2")));
        let half = S3Settings { access_key_id: Some("ID".into()), ..Default::default() };
        let e = half.resolve_with(&env_of(&[]), &f).unwrap_err();
        assert!(e.contains("s3_secret_access_key"), "{e}");
        assert!(!format!(
            "{:?}",
            S3Settings { secret_access_key: Some("SEKRIT".into()), ..Default::default() }
        )
        .contains("SEKRIT"));
    }

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
        let c = S3Settings::default().resolve_with(&env, &files(FILE)).unwrap();
        assert_eq!((c.access_key_id.as_str(), c.region.as_str()), ("ENV", "us-east-1"));
        assert_eq!(c.endpoint.as_deref(), Some("http://127.0.0.1:9000"));
        let c = S3Settings::default().resolve_with(&env_of(&[]), &files(FILE)).unwrap();
        assert_eq!(c.access_key_id, "DEF");
    }

    #[test]
    fn a_named_profile_and_the_exports_own_keys() {
        let env =
            env_of(&[("AWS_PROFILE", "work"), ("AWS_ACCESS_KEY_ID", "ENV"), ("AWS_SECRET_ACCESS_KEY", "s")]);
        let c = S3Settings::default().resolve_with(&env, &files(FILE)).unwrap();
        assert_eq!((c.access_key_id.as_str(), c.region.as_str()), ("WORK", "eu-west-1"));
        let own = S3Settings {
            access_key_id: Some("OWN".into()),
            secret_access_key: Some("SECRETVALUE".into()),
            region: Some("ap-south-1".into()),
            ..Default::default()
        };
        let c = own.resolve_with(&env, &files(FILE)).unwrap();
        assert_eq!((c.access_key_id.as_str(), c.region.as_str()), ("OWN", "ap-south-1"));
        assert!(!format!("{c:?}").contains("SECRETVALUE"), "the secret never shows: {c:?}");
    }

    #[test]
    fn missing_credentials_are_a_clear_error() {
        let e = S3Settings::default().resolve_with(&env_of(&[]), &AwsFiles::default()).unwrap_err();
        assert!(e.contains("AWS_ACCESS_KEY_ID") && e.contains("[default]"), "{e}");
        let env = env_of(&[("AWS_PROFILE", "nope")]);
        let e = S3Settings::default().resolve_with(&env, &files(FILE)).unwrap_err();
        assert!(e.contains("[nope]"), "{e}");
    }
}
