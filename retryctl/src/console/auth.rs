//! Who may use the console, and proof that a state change came from its own pages.
//!
//! Every request but the login page and the static assets needs the access token: as
//! `Authorization: Bearer <token>` (scripts), or through the login form, which checks the token once and
//! sets a session cookie (`HttpOnly`, `SameSite=Strict`) for the browser. A browser sends a cookie with
//! any request to the host, even one a page on another site makes it send — so every state change made
//! with a session must also carry the session's CSRF token (a hidden form field only the console's own
//! pages hold) and, when the browser names the page's origin, come from the console's own origin.
//! Tokens are compared in constant time.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, header};
use rand::RngCore;
use subtle::ConstantTimeEq;

/// The session cookie's name.
pub(crate) const COOKIE: &str = "retryctl_session";
/// How long a browser session lasts.
const SESSION_LIFETIME: Duration = Duration::from_secs(12 * 3600);
/// The shortest access token accepted.
pub const MIN_TOKEN_LEN: usize = 16;

/// Who made a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Caller {
    /// A script with the token in its `Authorization` header: no cookie, so no CSRF to fear.
    Bearer,
    /// A browser session, with the CSRF token its forms carry.
    Session { csrf: String },
}

impl Caller {
    /// The CSRF token the console's forms carry for this caller (empty for a bearer caller).
    pub(crate) fn csrf(&self) -> &str {
        match self {
            Caller::Bearer => "",
            Caller::Session { csrf } => csrf,
        }
    }
}

/// Why a state change was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The form did not carry the session's CSRF token.
    Csrf,
    /// The browser said the request came from a page of another origin.
    Origin,
}

impl Refusal {
    /// The refusal in words, for the page that says so.
    pub(crate) fn reason(self) -> &'static str {
        match self {
            Refusal::Csrf => {
                "the form did not carry this session's CSRF token: a state change must come from the \
                 console's own pages"
            }
            Refusal::Origin => "the request came from a page of another origin",
        }
    }
}

struct Session {
    csrf: String,
    started: Instant,
}

/// The most confirmations waiting to be used; the oldest are dropped beyond it.
const MAX_NONCES: usize = 1_000;
/// How long a wrong token's answer waits (one at a time).
const FAILED_LOGIN_DELAY: Duration = Duration::from_secs(1);

/// The access token, the browser sessions it opened, and the confirmations not yet used.
pub(crate) struct Auth {
    token: String,
    sessions: Mutex<HashMap<String, Session>>,
    nonces: Mutex<std::collections::VecDeque<String>>,
    failed_logins: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth").field("token", &"***").finish()
    }
}

/// 32 random bytes in hex, from the thread's cryptographically secure generator.
fn random_hex() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether `a` and `b` are equal, in time that does not depend on where they differ.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

impl Auth {
    /// Checks of `token`.
    pub(crate) fn new(token: String) -> Self {
        Self {
            token,
            sessions: Mutex::new(HashMap::new()),
            nonces: Mutex::new(std::collections::VecDeque::new()),
            failed_logins: tokio::sync::Mutex::new(()),
        }
    }

    /// Waits out a wrong token's delay, one caller at a time, so tokens are guessed at most once a second.
    pub(crate) async fn failed_login(&self) {
        let _one_at_a_time = self.failed_logins.lock().await;
        tokio::time::sleep(FAILED_LOGIN_DELAY).await;
    }

    /// A new one-time token for a confirmation form.
    pub(crate) fn issue_nonce(&self) -> String {
        let nonce = random_hex();
        let mut nonces = self.nonces.lock().unwrap_or_else(|p| p.into_inner());
        if nonces.len() >= MAX_NONCES {
            nonces.pop_front();
        }
        nonces.push_back(nonce.clone());
        nonce
    }

    /// Whether `given` is a confirmation's token not used yet; it is used up.
    pub(crate) fn use_nonce(&self, given: &str) -> bool {
        let mut nonces = self.nonces.lock().unwrap_or_else(|p| p.into_inner());
        match nonces.iter().position(|n| same(n, given)) {
            Some(at) => {
                nonces.remove(at);
                true
            }
            None => false,
        }
    }

    fn sessions(&self) -> std::sync::MutexGuard<'_, HashMap<String, Session>> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `given` is the access token.
    pub(crate) fn is_token(&self, given: &str) -> bool {
        same(given.trim(), &self.token)
    }

    /// Opens a browser session; returns its id (the cookie's value).
    pub(crate) fn open_session(&self) -> String {
        let id = random_hex();
        let mut sessions = self.sessions();
        sessions.retain(|_, s| s.started.elapsed() < SESSION_LIFETIME);
        sessions.insert(
            id.clone(),
            Session {
                csrf: random_hex(),
                started: Instant::now(),
            },
        );
        id
    }

    /// Ends the session the request's cookie names.
    pub(crate) fn close_session(&self, headers: &HeaderMap) {
        if let Some(id) = cookie(headers, COOKIE) {
            self.sessions().remove(&id);
        }
    }

    /// Who made a request with these headers, if anyone the console admits.
    pub(crate) fn caller(&self, headers: &HeaderMap) -> Option<Caller> {
        if let Some(value) = headers.get(header::AUTHORIZATION)
            && let Some(token) = value.to_str().ok().and_then(|v| v.strip_prefix("Bearer "))
        {
            return self.is_token(token).then_some(Caller::Bearer);
        }
        let id = cookie(headers, COOKIE)?;
        let sessions = self.sessions();
        // Looked up by equality of a 256-bit random id: no timing to learn a valid one from.
        let session = sessions.get(&id)?;
        (session.started.elapsed() < SESSION_LIFETIME).then(|| Caller::Session {
            csrf: session.csrf.clone(),
        })
    }

    /// Whether a state change by `caller` carrying `csrf`, with request `headers`, may go ahead.
    pub(crate) fn check_change(
        &self,
        caller: &Caller,
        csrf: &str,
        headers: &HeaderMap,
    ) -> Result<(), Refusal> {
        let Caller::Session { csrf: expected } = caller else {
            return Ok(());
        };
        if !same_origin(headers) {
            return Err(Refusal::Origin);
        }
        if same(csrf, expected) {
            Ok(())
        } else {
            Err(Refusal::Csrf)
        }
    }
}

/// Whether the request's `Origin` (when the browser sends one) is the host it was sent to.
pub(crate) fn same_origin(headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN).and_then(|o| o.to_str().ok()) else {
        return true;
    };
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default();
    origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
        .is_some_and(|o| o == host)
}

/// The value of cookie `name` in the request's `Cookie` headers.
fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v.to_string())
}

/// The `Set-Cookie` value that opens session `id` in the browser.
pub(crate) fn session_cookie(id: &str) -> String {
    format!("{COOKIE}={id}; HttpOnly; SameSite=Strict; Path=/")
}

/// The `Set-Cookie` value that ends the browser's session.
pub(crate) fn expired_cookie() -> String {
    format!("{COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn headers(pairs: &[(header::HeaderName, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in pairs {
            h.append(name.clone(), HeaderValue::from_str(value).unwrap());
        }
        h
    }

    #[test]
    fn a_bearer_token_or_a_session_cookie_admits() {
        let auth = Auth::new("0123456789abcdef".into());
        assert_eq!(auth.caller(&HeaderMap::new()), None);
        let bearer = headers(&[(header::AUTHORIZATION, "Bearer 0123456789abcdef")]);
        assert_eq!(auth.caller(&bearer), Some(Caller::Bearer));
        let wrong = headers(&[(header::AUTHORIZATION, "Bearer 0123456789abcdeX")]);
        assert_eq!(auth.caller(&wrong), None);
        let id = auth.open_session();
        let with_cookie = headers(&[(header::COOKIE, &format!("a=b; {COOKIE}={id}"))]);
        let Some(Caller::Session { csrf }) = auth.caller(&with_cookie) else {
            panic!("the session admits");
        };
        assert_eq!(csrf.len(), 64);
        let made_up = headers(&[(header::COOKIE, &format!("{COOKIE}={}", random_hex()))]);
        assert_eq!(auth.caller(&made_up), None);
        auth.close_session(&with_cookie);
        assert_eq!(auth.caller(&with_cookie), None, "logged out");
    }

    #[test]
    fn a_confirmation_token_is_used_once() {
        let auth = Auth::new("0123456789abcdef".into());
        let nonce = auth.issue_nonce();
        assert!(!auth.use_nonce("made-up"));
        assert!(auth.use_nonce(&nonce));
        assert!(!auth.use_nonce(&nonce), "used up");
        assert!(!auth.use_nonce(""));
    }

    #[test]
    fn a_session_change_needs_its_csrf_token_and_its_own_origin() {
        let auth = Auth::new("0123456789abcdef".into());
        let caller = Caller::Session {
            csrf: "c".repeat(64),
        };
        let own = headers(&[
            (header::HOST, "127.0.0.1:8080"),
            (header::ORIGIN, "http://127.0.0.1:8080"),
        ]);
        assert_eq!(auth.check_change(&caller, &"c".repeat(64), &own), Ok(()));
        assert_eq!(
            auth.check_change(&caller, "", &own),
            Err(Refusal::Csrf),
            "no token"
        );
        let cross = headers(&[
            (header::HOST, "127.0.0.1:8080"),
            (header::ORIGIN, "http://127.0.0.1:9999"),
        ]);
        assert_eq!(
            auth.check_change(&caller, &"c".repeat(64), &cross),
            Err(Refusal::Origin)
        );
        assert_eq!(
            auth.check_change(&Caller::Bearer, "", &cross),
            Ok(()),
            "a script sends no cookie"
        );
    }
}
