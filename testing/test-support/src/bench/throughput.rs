//! A throughput bench's report: each round's line, then the ratios of the SDK's rates to the raw
//! client's over the rounds, ending with the `ratio sdk/raw` line the performance tables read.

use std::time::Duration;

use super::clock::{micros, millis};
use super::workload::DEFAULT_PAYLOAD;
use super::{CpuPerMessage, Rate, payload_bytes, payload_label};

/// The raw client's and the SDK's rates, round by round.
#[derive(Debug, Default)]
pub struct Throughput {
    raw: Vec<Rate>,
    sdk: Vec<Rate>,
}

impl Throughput {
    /// Records and prints one round: `raw` named `raw_name` (e.g. "raw lapin"), with `detail` (the
    /// message count and settings).
    pub fn round(&mut self, raw: Rate, sdk: Rate, raw_name: &str, detail: &str) {
        self.raw.push(raw);
        self.sdk.push(sdk);
        println!(
            "round {}: {raw_name} {:.0} msg/s, SDK {:.0} msg/s; from the first message: {raw_name} {:.0} msg/s, SDK {:.0} msg/s; start-up to the first message: {raw_name} {:.0} ms, SDK {:.0} ms ({detail})",
            self.raw.len(),
            raw.whole,
            sdk.whole,
            raw.steady,
            sdk.steady,
            millis(raw.start_up),
            millis(sdk.start_up),
        );
        if let (Some(r), Some(s)) = (raw.cpu, sdk.cpu) {
            println!(
                "  CPU per message: {raw_name} {:.1} µs, the rest of the machine (the broker) {:.1} µs; SDK {:.1} µs, the rest {:.1} µs; system calls per message (reads + writes): {raw_name} {:.2} + {:.2}, SDK {:.2} + {:.2}",
                micros(r.process),
                micros(r.rest),
                micros(s.process),
                micros(s.rest),
                r.syscalls.0,
                r.syscalls.1,
                s.syscalls.0,
                s.syscalls.1,
            );
        }
    }

    /// Prints the ratio of the best rounds and of the medians, from the consumers' start and from their
    /// first message; the least, median and greatest of the rounds' own ratios (each SDK round against
    /// the raw round run beside it); then the summary line `ratio sdk/raw <broker> <payload>: x`
    /// (`100B`, `1KB`, `16KB`; the median SDK rate over the median raw rate, from the consumers' start).
    pub fn report(&self, broker: &str) {
        let best = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
        let median = |v: &[f64]| spread(v).map_or(0.0, |(_, median, _)| median);
        for (what, pick) in [
            (
                "from the consumer's start",
                (|r: &Rate| r.whole) as fn(&Rate) -> f64,
            ),
            ("from the first message", |r: &Rate| r.steady),
        ] {
            let sdk: Vec<f64> = self.sdk.iter().map(pick).collect();
            let raw: Vec<f64> = self.raw.iter().map(pick).collect();
            println!(
                "happy-path throughput {what}: SDK/raw = {:.2} (best of {}: SDK {:.0} msg/s, raw {:.0} msg/s); medians: {:.2}",
                best(&sdk) / best(&raw),
                raw.len(),
                best(&sdk),
                best(&raw),
                median(&sdk) / median(&raw)
            );
        }
        let cpu = |v: &[Rate], pick: fn(&CpuPerMessage) -> Duration| {
            median(
                &v.iter()
                    .filter_map(|r| r.cpu.as_ref().map(|c| micros(pick(c))))
                    .collect::<Vec<_>>(),
            )
        };
        if self.raw.iter().chain(&self.sdk).all(|r| r.cpu.is_some()) {
            println!(
                "CPU per message, medians: raw client {:.1} µs, SDK {:.1} µs; the rest of the machine (the broker) with raw {:.1} µs, with the SDK {:.1} µs",
                cpu(&self.raw, |c| c.process),
                cpu(&self.sdk, |c| c.process),
                cpu(&self.raw, |c| c.rest),
                cpu(&self.sdk, |c| c.rest),
            );
        }
        let start_up =
            |v: &[Rate]| median(&v.iter().map(|r| millis(r.start_up)).collect::<Vec<_>>());
        println!(
            "start-up to the first message, medians: raw client {:.0} ms, SDK {:.0} ms",
            start_up(&self.raw),
            start_up(&self.sdk),
        );
        let per_round: Vec<f64> = self
            .sdk
            .iter()
            .zip(&self.raw)
            .map(|(s, r)| s.whole / r.whole)
            .collect();
        if let Some((min, median, max)) = spread(&per_round) {
            println!(
                "SDK/raw per round (each SDK round against the raw round beside it, from the consumer's start), {} rounds: min {min:.2}, median {median:.2}, max {max:.2}",
                per_round.len()
            );
        }
        let whole = |v: &[Rate]| median(&v.iter().map(|r| r.whole).collect::<Vec<_>>());
        println!(
            "ratio sdk/raw {broker} {}: {:.2}",
            payload_label(payload_bytes().unwrap_or(DEFAULT_PAYLOAD)),
            whole(&self.sdk) / whole(&self.raw)
        );
    }
}

/// The smallest, the median (the upper one of an even count) and the largest of `values`; `None` when
/// there are none.
pub fn spread(values: &[f64]) -> Option<(f64, f64, f64)> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    Some((*sorted.first()?, sorted[sorted.len() / 2], *sorted.last()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spread_is_the_least_the_middle_and_the_most_of_its_rounds() {
        assert_eq!(spread(&[0.9, 0.6, 0.7]), Some((0.6, 0.7, 0.9)));
        assert_eq!(spread(&[0.5, 0.8]), Some((0.5, 0.8, 0.8)));
        assert_eq!(spread(&[1.1]), Some((1.1, 1.1, 1.1)));
        assert_eq!(spread(&[]), None);
    }
}
