//! F5's pause check: what the handler's record and the broker showed in the second half of a DLQ
//! outage, and whether that is a consumer that paused. Pure, so each sign of consumption going on is
//! tested without a broker.

use crate::record::Tally;

/// A DLQ outage as the pause check sees it. Once the first dead letter is refused, the consumer must
/// pause: the events it had already taken finish within a second (10 ms of work each), and no event
/// starts after that; in the outage's second half the broker's count of the source's messages waiting
/// for the group does not fall; and no refused event is delivered again (its original stayed unsettled
/// with the consumer that holds it).
#[derive(Clone, Copy, Debug)]
pub(crate) struct OutageHalf {
    /// When it began and ended (ms since the epoch).
    pub(crate) from: u64,
    pub(crate) to: u64,
    /// Messages the broker held for the group then, read with its own client.
    pub(crate) waiting_from: u64,
    pub(crate) waiting_to: u64,
}

impl OutageHalf {
    /// Whether the record and the broker show a consumer that paused and left the original unsettled,
    /// and the words for the row's note.
    pub(crate) fn verdict(&self, tally: &Tally, fault_start: u64) -> (bool, String) {
        let first_refusal = tally
            .refusal_times
            .iter()
            .copied()
            .filter(|&t| t >= fault_start && t < self.from)
            .min();
        let Some(first_refusal) = first_refusal else {
            return (
                false,
                "pause check: no dead letter was refused in the outage's first half — NOT shown"
                    .into(),
            );
        };
        let settled_in = 1_000;
        let started = tally.started_between(first_refusal + settled_in, self.to);
        let redelivered = tally.refused_again(0, self.to);
        let paused = started == 0 && self.waiting_to >= self.waiting_from && redelivered.is_empty();
        let mut words = format!(
            "pause check: {started} events started from 1 s after the first refused dead letter to the \
             outage's end, the broker's count of waiting messages {} → {} over its second half",
            self.waiting_from, self.waiting_to
        );
        if !redelivered.is_empty() {
            words.push_str(&format!(
                ", refused events called again: {}",
                first_ids(
                    &redelivered
                        .iter()
                        .map(|s| s.to_string())
                        .collect::<Vec<_>>()
                )
            ));
        }
        words.push_str(if paused {
            " — paused"
        } else {
            " — NOT paused"
        });
        (paused, words)
    }
}

/// The first five of `ids`, for a note.
pub(crate) fn first_ids(ids: &[String]) -> String {
    let shown: Vec<&str> = ids.iter().take(5).map(String::as_str).collect();
    shown.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Calls;

    fn calls(first_at: u64, calls: u32, refusals: u32) -> Calls {
        Calls {
            calls,
            oks: calls - refusals,
            refusals,
            first_at,
        }
    }

    #[test]
    fn the_pause_check_fails_on_each_sign_of_consumption_going_on() {
        let half = OutageHalf {
            from: 1_000,
            to: 2_000,
            waiting_from: 500,
            waiting_to: 500,
        };
        let mut tally = Tally::default();
        tally.by_id.insert("ev-00001".into(), calls(100, 1, 0));
        tally.by_id.insert("ev-00007".into(), calls(300, 1, 1));
        tally.refusal_times.push(300);
        // Taken before the refusal, finished within the second after it.
        tally.by_id.insert("ev-00002".into(), calls(1_200, 1, 0));
        assert!(half.verdict(&tally, 0).0, "paused");
        assert!(
            !half.verdict(&tally, 400).0,
            "no refusal in the outage: nothing shown"
        );
        let mut started = Tally::default();
        started.refusal_times.clone_from(&tally.refusal_times);
        started.by_id.clone_from(&tally.by_id);
        started.by_id.insert("ev-00003".into(), calls(1_400, 1, 0));
        assert!(
            !half.verdict(&started, 0).0,
            "an event started after the pause"
        );
        let fell = OutageHalf {
            waiting_to: 499,
            ..half
        };
        assert!(!fell.verdict(&tally, 0).0, "the broker's count fell");
        let mut again = Tally::default();
        again.refusal_times.clone_from(&tally.refusal_times);
        again.by_id.clone_from(&tally.by_id);
        again.by_id.insert("ev-00107".into(), calls(250, 2, 2));
        let (paused, words) = half.verdict(&again, 0);
        assert!(!paused && words.contains("ev-00107"), "{words}");
    }
}
