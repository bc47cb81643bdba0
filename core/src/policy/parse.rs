//! The recursive-descent parser of the policy DSL.
//!
//! It works on characters rather than bytes so that error columns are what a
//! person counts in the input (`±` is one column). It never panics: every
//! number is accumulated with checked arithmetic and every out-of-range value
//! becomes a [`PolicyParseError`] pointing at the value, saying what would have
//! been accepted there.

use std::time::Duration;

use super::duration::{DurationLit, unit_millis};
use super::{Jitter, PolicyParseError, RetryPolicy, Schedule, Step};

/// Parses a whole policy string.
pub(super) fn parse_policy(input: &str) -> Result<RetryPolicy, PolicyParseError> {
    Parser::new(input).policy()
}

type PResult<T> = Result<T, PolicyParseError>;

/// How many arguments after the factor an exponential form takes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Retries {
    /// `exp(...)`: the retry count is optional.
    Optional,
    /// `LimitedExponentialRetryPolicy(...)`: it is required.
    Required,
    /// `UnlimitedExponentialRetryPolicy(...)`: there is none.
    Forbidden,
}

/// Longest token quoted in an error message, in characters.
const MAX_TOKEN: usize = 24;

const BODY_EXPECTED: &str = "a delay (e.g. 5s), 'exp(' or a policy name \
     (FixedDelayRetryPolicy, LimitedExponentialRetryPolicy, UnlimitedExponentialRetryPolicy)";

struct Parser<'a> {
    input: &'a str,
    chars: Vec<char>,
    pos: usize,
}

impl<'a> Parser<'a> {
    fn new(input: &'a str) -> Self {
        Self {
            input,
            chars: input.chars().collect(),
            pos: 0,
        }
    }

    // ---- policy level ------------------------------------------------------

    fn policy(mut self) -> PResult<RetryPolicy> {
        self.skip_ws();
        let (schedule, after_body) = self.body()?;
        let mut policy = RetryPolicy::from_schedule(schedule);
        let mut seen_jitter = false;
        let mut seen_budget = false;
        let mut seen_bound = false;
        let mut after = after_body;
        loop {
            self.skip_ws();
            match self.peek() {
                None => return Ok(policy),
                Some(';') => self.pos += 1,
                Some(_) => return Err(self.error(self.pos, after)),
            }
            after = "';' or end of input";
            self.skip_ws();
            let start = self.pos;
            let name = self.take_while(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
            let seen = match name.as_str() {
                "jitter" => &mut seen_jitter,
                "max-elapsed" => &mut seen_budget,
                "max-delay" => &mut seen_bound,
                "" => {
                    return Err(
                        self.error(start, "an option (jitter=…, max-elapsed=… or max-delay=…)")
                    );
                }
                _ => {
                    return Err(self.error_found(
                        start,
                        "an option name (jitter, max-elapsed or max-delay)",
                        quote(&name),
                    ));
                }
            };
            if *seen {
                return Err(self.error_found(
                    start,
                    "each option at most once",
                    format!("a second {}", quote(&name)),
                ));
            }
            *seen = true;
            self.expect('=', &format!("'=' after '{name}'"))?;
            self.skip_ws();
            if name == "jitter" {
                policy.jitter = self.jitter()?;
            } else if name == "max-delay" {
                let bound = self.duration(
                    "the longest delay a handler may choose (e.g. 5m)",
                    "a unit (ms, s, m, h or d)",
                )?;
                policy.max_chosen_delay = Some(Duration::from_millis(bound));
            } else {
                let budget =
                    self.duration("a time budget (e.g. 1h)", "a unit (ms, s, m, h or d)")?;
                policy.max_elapsed = Some(Duration::from_millis(budget));
            }
        }
    }

    /// The schedule, and what may follow it (for the "trailing input" error).
    fn body(&mut self) -> PResult<(Schedule, &'static str)> {
        let start = self.pos;
        match self.peek() {
            Some(c) if c.is_ascii_digit() => {
                let (steps, last_counted) = self.steps()?;
                let after = if last_counted {
                    "',', ';' or end of input"
                } else {
                    "'x', ',', ';' or end of input"
                };
                Ok((Schedule::Steps(steps), after))
            }
            Some(c) if c.is_ascii_alphabetic() => {
                let name = self.take_while(|c| c.is_ascii_alphanumeric() || c == '_');
                let schedule = match name.as_str() {
                    "exp" => self.exponential(Retries::Optional)?,
                    "LimitedExponentialRetryPolicy" => self.exponential(Retries::Required)?,
                    "UnlimitedExponentialRetryPolicy" => self.exponential(Retries::Forbidden)?,
                    "FixedDelayRetryPolicy" => {
                        self.expect('(', "'(' after FixedDelayRetryPolicy")?;
                        self.skip_ws();
                        let (steps, last_counted) = self.steps()?;
                        let expected = if last_counted {
                            "',' or ')'"
                        } else {
                            "'x', ',' or ')'"
                        };
                        self.expect(')', expected)?;
                        Schedule::Steps(steps)
                    }
                    _ => return Err(self.error_found(start, BODY_EXPECTED, quote(&name))),
                };
                Ok((schedule, "';' or end of input"))
            }
            _ => Err(self.error(start, BODY_EXPECTED)),
        }
    }

    // ---- schedules -----------------------------------------------------------

    /// `step ("," step)*`; also reports whether the last step had an `xN`.
    fn steps(&mut self) -> PResult<(Vec<Step>, bool)> {
        let mut steps = Vec::new();
        let mut total = 0u64;
        loop {
            let delay_at = self.pos;
            let delay = self.duration("a delay (e.g. 5s)", "a unit (ms, s, m, h or d) or 'x'")?;
            self.skip_ws();
            let counted = matches!(self.peek(), Some('x' | 'X'));
            let mut count_at = delay_at;
            let count = if counted {
                self.pos += 1;
                self.skip_ws();
                count_at = self.pos;
                self.count("a repeat count after 'x'", "a repeat count of at least 1")?
            } else {
                1
            };
            // The runtime counts retries in a u32: a longer schedule would disagree with its limit.
            total += u64::from(count);
            if total > u64::from(u32::MAX) {
                return Err(self.error(
                    count_at,
                    "repeat counts adding up to at most 4294967295 retries",
                ));
            }
            steps.push(Step {
                delay: Duration::from_millis(delay),
                count,
            });
            self.skip_ws();
            if self.peek() == Some(',') {
                self.pos += 1;
                self.skip_ws();
            } else {
                return Ok((steps, counted));
            }
        }
    }

    /// The parenthesised arguments of an exponential form, validated.
    fn exponential(&mut self, retries_arg: Retries) -> PResult<Schedule> {
        self.expect('(', "'(' and the initial delay")?;
        self.skip_ws();
        let initial_at = self.pos;
        let initial =
            self.duration("an initial delay (e.g. 500ms)", "a unit (ms, s, m, h or d)")?;
        if initial == 0 {
            return Err(self.error(initial_at, "an initial delay greater than 0"));
        }
        self.expect(',', "',' and the cap after the initial delay")?;
        self.skip_ws();
        let cap = self.duration("a cap (e.g. 60s)", "a unit (ms, s, m, h or d)")?;
        if initial > cap {
            let expected = format!(
                "an initial delay no greater than the cap ({})",
                DurationLit(cap)
            );
            return Err(self.error(initial_at, &expected));
        }
        self.expect(',', "',' and the growth factor after the cap")?;
        self.skip_ws();
        let factor = self.factor()?;
        self.skip_ws();
        let retries = match (retries_arg, self.peek()) {
            (Retries::Optional | Retries::Required, Some(',')) => {
                self.pos += 1;
                self.skip_ws();
                Some(self.count("a retry count", "a retry count of at least 1")?)
            }
            (Retries::Required, _) => {
                return Err(self.error(self.pos, "',' and the retry count after the factor"));
            }
            _ => None,
        };
        let expected = match (retries_arg, retries) {
            (Retries::Optional, None) => "',' and a retry count, or ')'",
            _ => "')'",
        };
        self.expect(')', expected)?;
        Ok(Schedule::Exponential {
            initial: Duration::from_millis(initial),
            cap: Duration::from_millis(cap),
            factor,
            retries,
        })
    }

    fn jitter(&mut self) -> PResult<Jitter> {
        const EXPECTED: &str = "a jitter mode (none, full, equal, decorrelated or N%)";
        let start = self.pos;
        if self.peek().is_some_and(|c| c.is_ascii_alphabetic()) {
            let word = self.take_while(|c| c.is_ascii_alphanumeric());
            return match word.as_str() {
                "none" => Ok(Jitter::None),
                "full" => Ok(Jitter::Full),
                "equal" => Ok(Jitter::Equal),
                "decorrelated" => Ok(Jitter::Decorrelated),
                _ => Err(self.error_found(start, EXPECTED, quote(&word))),
            };
        }
        if self.peek() == Some('±') {
            self.pos += 1;
        } else if self.peek() == Some('+') && self.chars.get(self.pos + 1) == Some(&'-') {
            self.pos += 2;
        }
        let digits_at = self.pos;
        let Some(n) = self.number()? else {
            return Err(if digits_at == start {
                self.error(start, EXPECTED)
            } else {
                self.error(digits_at, "a jitter percentage after the sign (e.g. ±20%)")
            });
        };
        if !(1..=100).contains(&n) {
            return Err(self.error(digits_at, "a jitter percentage from 1 to 100"));
        }
        if self.peek() != Some('%') {
            return Err(self.error(self.pos, "'%' after the jitter percentage"));
        }
        self.pos += 1;
        // `n` is at most 100 here.
        Ok(Jitter::Percent(u8::try_from(n).unwrap_or(100)))
    }

    // ---- literals -----------------------------------------------------------

    /// A duration literal in milliseconds. `what` names the duration for the
    /// "nothing here" error; `unit` lists what may follow the digits.
    fn duration(&mut self, what: &str, unit: &str) -> PResult<u64> {
        let start = self.pos;
        let Some(value) = self.number()? else {
            return Err(self.error(start, what));
        };
        let unit_at = self.pos;
        // Units never contain 'x', so `5000x3` and `5sx3` split where intended.
        let name = self.take_while(|c| c.is_ascii_alphabetic() && c != 'x' && c != 'X');
        let Some(size) = unit_millis(&name) else {
            return Err(self.error_found(unit_at, unit, quote(&name)));
        };
        value
            .checked_mul(size)
            .ok_or_else(|| self.error(start, "a duration of at most u64::MAX milliseconds"))
    }

    /// A repeat or retry count: an integer from 1 to `u32::MAX`.
    fn count(&mut self, what: &str, at_least_one: &str) -> PResult<u32> {
        let start = self.pos;
        let Some(value) = self.number()? else {
            return Err(self.error(start, what));
        };
        match u32::try_from(value) {
            Ok(0) => Err(self.error(start, at_least_one)),
            Ok(count) => Ok(count),
            Err(_) => Err(self.error(start, "a count of at most 4294967295")),
        }
    }

    /// A growth factor: `digits ["." digits]`, finite and at least 1.
    fn factor(&mut self) -> PResult<f64> {
        let start = self.pos;
        let mut text = self.take_while(|c| c.is_ascii_digit());
        if text.is_empty() {
            return Err(self.error(start, "a growth factor (e.g. 2 or 1.5)"));
        }
        if self.peek() == Some('.') {
            self.pos += 1;
            let fraction = self.take_while(|c| c.is_ascii_digit());
            if fraction.is_empty() {
                return Err(self.error(self.pos, "digits after the decimal point"));
            }
            text.push('.');
            text.push_str(&fraction);
        }
        match text.parse::<f64>() {
            Ok(factor) if factor.is_finite() && factor >= 1.0 => Ok(factor),
            Ok(factor) if factor.is_finite() => {
                Err(self.error(start, "a growth factor of at least 1"))
            }
            _ => Err(self.error(start, "a finite growth factor")),
        }
    }

    /// An unsigned decimal integer; `None` when there are no digits here.
    fn number(&mut self) -> PResult<Option<u64>> {
        let start = self.pos;
        let mut value: Option<u64> = Some(0);
        while let Some(digit) = self.peek().and_then(|c| c.to_digit(10)) {
            value = value
                .and_then(|v| v.checked_mul(10))
                .and_then(|v| v.checked_add(u64::from(digit)));
            self.pos += 1;
        }
        if self.pos == start {
            return Ok(None);
        }
        match value {
            Some(value) => Ok(Some(value)),
            None => Err(self.error(start, "a number of at most 18446744073709551615")),
        }
    }

    // ---- characters ---------------------------------------------------------

    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn skip_ws(&mut self) {
        while self.peek().is_some_and(char::is_whitespace) {
            self.pos += 1;
        }
    }

    fn take_while(&mut self, keep: impl Fn(char) -> bool) -> String {
        let start = self.pos;
        while self.peek().is_some_and(&keep) {
            self.pos += 1;
        }
        self.chars[start..self.pos].iter().collect()
    }

    /// Skips whitespace, then consumes `c` or fails with `expected`.
    fn expect(&mut self, c: char, expected: &str) -> PResult<()> {
        self.skip_ws();
        if self.peek() == Some(c) {
            self.pos += 1;
            Ok(())
        } else {
            Err(self.error(self.pos, expected))
        }
    }

    // ---- errors ---------------------------------------------------------------

    /// An error at character index `at`, quoting the token found there.
    fn error(&self, at: usize, expected: &str) -> PolicyParseError {
        self.error_found(at, expected, self.token_at(at))
    }

    fn error_found(&self, at: usize, expected: &str, found: String) -> PolicyParseError {
        PolicyParseError {
            input: self.input.to_owned(),
            column: at + 1,
            expected: expected.to_owned(),
            found,
        }
    }

    /// The token starting at `at`, quoted: a run of word characters, or a
    /// single other character, or `end of input`.
    fn token_at(&self, at: usize) -> String {
        let rest = self.chars.get(at..).unwrap_or_default();
        let Some(&first) = rest.first() else {
            return "end of input".to_owned();
        };
        let word = |c: &char| c.is_alphanumeric() || matches!(c, '_' | '-' | '.');
        let token: String = if word(&first) {
            rest.iter().take_while(|c| word(c)).collect()
        } else {
            first.to_string()
        };
        quote(&token)
    }
}

/// Quotes a token for an error message, shortening long ones and escaping
/// control characters.
fn quote(token: &str) -> String {
    let mut shown: String = token.chars().take(MAX_TOKEN).collect();
    if token.chars().count() > MAX_TOKEN {
        shown.push('…');
    }
    format!("'{}'", shown.escape_debug())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Parses `input`, which must fail, and returns the error.
    fn fail(input: &str) -> PolicyParseError {
        match parse_policy(input) {
            Ok(policy) => panic!("{input:?} parsed as {policy}"),
            Err(err) => err,
        }
    }

    /// Asserts the column and that `expected` mentions `needle`.
    fn assert_error(input: &str, column: usize, needle: &str) {
        let err = fail(input);
        assert_eq!(err.column(), column, "{input:?}: {err}");
        assert!(err.expected().contains(needle), "{input:?}: {err}");
        let message = err.to_string();
        assert!(
            message.starts_with(&format!("column {column}: expected ")),
            "{message}"
        );
        assert!(message.contains(", found "), "{message}");
    }

    #[test]
    fn missing_count() {
        let err = fail("5000x");
        assert_eq!(
            err.to_string(),
            "column 6: expected a repeat count after 'x', found end of input"
        );
        assert_eq!(
            err.render(),
            "5000x\n     ^\ncolumn 6: expected a repeat count after 'x', found end of input"
        );
    }

    #[test]
    fn empty_input() {
        assert_error("", 1, "a delay");
        assert_error("   ", 4, "a delay");
        assert_eq!(fail("").found(), "end of input");
    }

    #[test]
    fn step_errors() {
        assert_error("5000y3", 5, "a unit");
        assert_eq!(fail("5000y3").found(), "'y'");
        assert_error("5000x0", 6, "at least 1");
        assert_eq!(fail("5000x0").found(), "'0'");
        assert_error("5s x3 foo", 7, "','");
        assert_eq!(fail("5s x3 foo").found(), "'foo'");
        assert_error("5s 3", 4, "'x'");
        assert_error("5s,", 4, "a delay");
        assert_error("5sec", 2, "a unit");
        assert_error("1.5s", 2, "'x'");
        assert_error("5s x99999999999", 5, "at most 4294967295");
    }

    #[test]
    fn exp_errors() {
        assert_error("exp(1s,", 8, "a cap");
        assert_error("exp(2s,1s,2)", 5, "no greater than the cap (1s)");
        assert_eq!(fail("exp(2s,1s,2)").found(), "'2s'");
        assert_error("exp(0, 1s, 2)", 5, "greater than 0");
        assert_error("exp(1s, 1m, 0.5)", 13, "at least 1");
        assert_error("exp(1s, 1m, 2.)", 15, "digits after the decimal point");
        assert_error("exp(1s, 1m, 2, 0)", 16, "at least 1");
        assert_error("exp(1s, 1m, 2", 14, "')'");
        assert_error("exp 1s", 5, "'('");
        assert_error("exp(1s, 1m, 2) x", 16, "';' or end of input");
        assert_error("Exp(1s, 1m, 2)", 1, "a policy name");
        assert_error(
            "LimitedExponentialRetryPolicy(1s, 1m, 2)",
            40,
            "the retry count",
        );
        assert_error("UnlimitedExponentialRetryPolicy(1s, 1m, 2, 3)", 42, "')'");
        assert_error("FixedDelayRetryPolicy(5000x3", 29, "')'");
        let huge = format!("exp(1s, 1m, 1{})", "0".repeat(400));
        assert_error(&huge, 13, "a finite growth factor");
    }

    #[test]
    fn option_errors() {
        assert_error("jitter=bogus", 1, "a delay");
        assert_eq!(fail("jitter=bogus").found(), "'jitter'");
        assert_error("5s; jitter=bogus", 12, "a jitter mode");
        assert_eq!(fail("5s; jitter=bogus").found(), "'bogus'");
        assert_error("5s; jitter=0%", 12, "from 1 to 100");
        assert_error("5s; jitter=101%", 12, "from 1 to 100");
        assert_error("5s; jitter=±0%", 13, "from 1 to 100");
        assert_error("5s; jitter=20", 14, "'%'");
        assert_error("5s; jitter=full; jitter=none", 18, "at most once");
        assert_eq!(
            fail("5s; jitter=full; jitter=none").found(),
            "a second 'jitter'"
        );
        assert_error("5s; max-elapsed=1h; max-elapsed=2h", 21, "at most once");
        assert_error("5s; retries=3", 5, "an option name");
        assert_error(
            "5s; max-delay=",
            15,
            "the longest delay a handler may choose",
        );
        assert_error(
            "5s; max-delay=1s; max-delay=2s",
            19,
            "each option at most once",
        );
        assert_error("5s;", 4, "an option");
        assert_error("5s; jitter", 11, "'='");
        assert_error("5s; max-elapsed=", 17, "a time budget");
    }

    #[test]
    fn overflow_is_an_error() {
        assert_error("99999999999999999999d", 1, "at most");
        assert_error("999999999999999d", 1, "a duration of at most");
        assert_error("5s; max-elapsed=99999999999999999999d", 17, "at most");
    }

    #[test]
    fn columns_count_characters() {
        // '±' is one column although it is two bytes.
        assert_error("5s; jitter=±x", 13, "a jitter percentage");
        let err = fail("5s;\tjitter=bogus");
        assert_eq!(err.render().lines().nth(1), Some("   \t       ^"));
    }

    const TOKENS: &[&str] = &[
        "exp",
        "(",
        ")",
        ",",
        ";",
        "jitter",
        "=",
        "max-elapsed",
        "full",
        "decorrelated",
        "50%",
        "±",
        "+-",
        "5",
        "0",
        "1.5",
        "ms",
        "s",
        "m",
        "h",
        "d",
        "x",
        "X",
        "3",
        " ",
        "99999999999999999999",
        "FixedDelayRetryPolicy",
        "LimitedExponentialRetryPolicy",
        "UnlimitedExponentialRetryPolicy",
        "%",
        ".",
        "\n",
    ];

    fn check(input: &str) -> Result<(), TestCaseError> {
        match parse_policy(input) {
            Ok(policy) => {
                let text = policy.to_string();
                prop_assert_eq!(parse_policy(&text), Ok(policy), "{}", text);
            }
            Err(err) => {
                prop_assert!(err.column() >= 1);
                prop_assert!(err.column() <= input.chars().count() + 1);
                prop_assert!(err.render().ends_with(&err.to_string()));
            }
        }
        Ok(())
    }

    proptest! {
        #[test]
        fn never_panics_on_any_string(input in "\\PC{0,60}") {
            check(&input)?;
        }

        #[test]
        fn never_panics_on_dsl_characters(input in "[0-9a-zX(),;=%.± +-]{0,40}") {
            check(&input)?;
        }

        #[test]
        fn never_panics_on_dsl_tokens(tokens in prop::collection::vec(prop::sample::select(TOKENS), 0..16)) {
            check(&tokens.concat())?;
        }

        #[test]
        fn never_panics_on_mutated_policies(
            base in prop::sample::select(vec![
                "5000x3,10000x5",
                "exp(500ms, 1m, 2); jitter=full; max-elapsed=1h",
                "LimitedExponentialRetryPolicy(1000, 60000, 1.5, 4); jitter=±20%",
                "FixedDelayRetryPolicy(5000x3, 15000x5)",
            ]),
            cut in 0usize..80,
            insert in "[0-9a-zX(),;=%. ]{0,3}",
        ) {
            let chars: Vec<char> = base.chars().collect();
            let cut = cut.min(chars.len());
            let mut input: String = chars[..cut].iter().collect();
            input.push_str(&insert);
            input.extend(&chars[cut..]);
            check(&input)?;
        }
    }
}
