//! The lines both consumers print on standard output, and their parsing. Anything else a process prints
//! (a JVM's or a framework's own lines) is ignored.

/// One report line from a consumer under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Line {
    /// `PEER late <ms>`: a retry started `ms` milliseconds after its due time (negative: early).
    Late(i64),
    /// `PEER done <events> <ms>`: `events` events succeeded, `ms` from the first record to the last.
    Done {
        /// Events that succeeded.
        events: u64,
        /// Milliseconds from the first record to the last success.
        millis: u64,
    },
}

impl Line {
    /// The line as a consumer prints it.
    pub fn render(&self) -> String {
        match self {
            Line::Late(ms) => format!("PEER late {ms}"),
            Line::Done { events, millis } => format!("PEER done {events} {millis}"),
        }
    }

    /// Parses a report line; `None` for any other output.
    pub fn parse(line: &str) -> Option<Line> {
        let mut words = line.trim().strip_prefix("PEER ")?.split_whitespace();
        match (words.next()?, words.next(), words.next(), words.next()) {
            ("late", Some(ms), None, None) => ms.parse().ok().map(Line::Late),
            ("done", Some(events), Some(ms), None) => Some(Line::Done {
                events: events.parse().ok()?,
                millis: ms.parse().ok()?,
            }),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_lines_round_trip_and_other_output_is_ignored() {
        for line in [
            Line::Late(-3),
            Line::Late(184),
            Line::Done {
                events: 100_000,
                millis: 612,
            },
        ] {
            assert_eq!(Line::parse(&line.render()), Some(line));
        }
        for other in [
            "",
            "PEER",
            "PEER late",
            "PEER late x",
            "PEER done 5",
            "PEER done 5 6 7",
            "2026-11-25 WARN o.a.k.c.NetworkClient PEER late 5",
            "PEER later 5",
        ] {
            assert_eq!(Line::parse(other), None, "{other:?}");
        }
    }
}
