//! A run's lateness percentiles and how a report shows them (a figure's min / median / max across
//! rounds is `test_support::bench::spread`).

use test_support::bench::percentile;

/// Lateness percentiles of one run, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lateness {
    /// Retries measured.
    pub count: usize,
    /// Median.
    pub p50: i64,
    /// 99th percentile.
    pub p99: i64,
    /// Largest.
    pub max: i64,
    /// Retries that started before their due time.
    pub early: usize,
}

impl Lateness {
    /// Percentiles of `late_ms` (nearest rank); `None` when no retry was measured.
    pub fn of(late_ms: &[i64]) -> Option<Lateness> {
        if late_ms.is_empty() {
            return None;
        }
        let mut v = late_ms.to_vec();
        v.sort_unstable();
        Some(Lateness {
            count: v.len(),
            p50: percentile(&v, 50),
            p99: percentile(&v, 99),
            max: v[v.len() - 1],
            early: v.iter().filter(|&&l| l < 0).count(),
        })
    }

    /// `p50 / p99 / max` for a table cell.
    pub fn cell(&self) -> String {
        format!(
            "{} / {} / {} ms ({} retries, {} early)",
            self.p50, self.p99, self.max, self.count, self.early
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_the_values_given() {
        let late: Vec<i64> = (1..=100).collect();
        let l = Lateness::of(&late).expect("some");
        assert_eq!(
            (l.count, l.p50, l.p99, l.max, l.early),
            (100, 50, 99, 100, 0)
        );
        let l = Lateness::of(&[-5, 10]).expect("some");
        assert_eq!((l.p50, l.p99, l.max, l.early), (-5, 10, 10, 1));
        assert_eq!(Lateness::of(&[]), None);
    }
}
