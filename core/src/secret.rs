//! Passwords, tokens and private keys as a type that never shows itself.
//!
//! A secret reaches an adapter as an option, and an option may be written inline
//! (`sasl.password=...`), but it never has to be: `<key>_env` names an environment variable that holds
//! it and `<key>_file` a file (a mounted secret), so a URL or config file can be logged, committed or
//! shown by `retryctl` without giving anything away. Once read, the value lives in a [`Secret`], whose
//! `Debug` and `Display` print `***`; only [`Secret::expose`] hands it over, at the one place a broker
//! client needs it.

use std::fmt;
use std::path::Path;

use crate::error::{Error, Kind};

/// A secret value: shown as `***` by `Debug` and `Display`.
///
/// ```
/// use event_retry_core::secret::Secret;
///
/// let password = Secret::new("hunter2");
/// assert_eq!(format!("{password} {password:?}"), "*** Secret(***)");
/// assert_eq!(password.expose(), "hunter2");
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// A secret with this value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The value, for the broker client that needs it; never for a log line or a message.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The content of the file at `path`, without one trailing line break (files written by editors
    /// and `echo` end with one; a secret never does). An empty or unreadable file is an error naming
    /// the path, never the content.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, Error> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| {
            Error::new(
                Kind::Config,
                format!("cannot read the secret file {}: {e}", path.display()),
            )
        })?;
        let value = text
            .strip_suffix("\r\n")
            .or_else(|| text.strip_suffix('\n'))
            .unwrap_or(&text);
        if value.is_empty() {
            return Err(Error::new(
                Kind::Config,
                format!("the secret file {} is empty", path.display()),
            ));
        }
        Ok(Self::new(value))
    }

    /// The value of environment variable `name`; an unset or empty variable is an error naming it.
    pub fn from_env(name: &str) -> Result<Self, Error> {
        match std::env::var(name) {
            Ok(value) if !value.is_empty() => Ok(Self::new(value)),
            Ok(_) => Err(Error::new(
                Kind::Config,
                format!("the environment variable {name} holding a secret is empty"),
            )),
            Err(_) => Err(Error::new(
                Kind::Config,
                format!("the environment variable {name} holding a secret is not set"),
            )),
        }
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_file_loses_one_line_break_and_errors_name_the_path_not_the_content() {
        let dir = std::env::temp_dir().join(format!("secret-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("password");
        std::fs::write(&file, "s3cret\n").unwrap();
        assert_eq!(Secret::from_file(&file).unwrap().expose(), "s3cret");
        std::fs::write(&file, "\n").unwrap();
        let e = Secret::from_file(&file).unwrap_err();
        assert!(e.to_string().contains("is empty"), "{e}");
        let e = Secret::from_file(dir.join("missing")).unwrap_err();
        assert_eq!(e.kind(), Kind::Config);
        assert!(e.to_string().contains("missing"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_unset_variable_is_named() {
        let e = Secret::from_env("EVENT_RETRY_SURELY_UNSET_VARIABLE").unwrap_err();
        assert!(
            e.to_string()
                .contains("EVENT_RETRY_SURELY_UNSET_VARIABLE holding a secret is not set"),
            "{e}"
        );
    }
}
