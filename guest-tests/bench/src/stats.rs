//! The statistics of the rounds: true medians with their min–max spread,
//! and per-round ratios.

/// Median (the mean of the middle two for an even count), min and max.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

/// The spread of `values`; none for no values.
pub fn spread(values: &[f64]) -> Option<Spread> {
    let mut v: Vec<f64> = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let (first, last) = (*v.first()?, *v.last()?);
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    Some(Spread {
        median,
        min: first,
        max: last,
    })
}

/// Per-round ratios a[i]/b[i]: both were measured in the same round, so
/// their spread is the honest spread of the ratio. Rounds where b is 0
/// are left out.
pub fn ratios(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter()
        .zip(b)
        .filter(|(_, &b)| b > 0.0)
        .map(|(a, b)| a / b)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Catches: a median that is not the middle value (unsorted input,
    /// an even count not averaged), and ratios against a zero.
    #[test]
    fn true_median_and_spread() {
        assert_eq!(spread(&[]), None);
        let s = spread(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max), (2.0, 1.0, 3.0));
        let s = spread(&[4.0, 1.0, 2.0, 10.0]).unwrap();
        assert_eq!((s.median, s.min, s.max), (3.0, 1.0, 10.0));
        assert_eq!(ratios(&[2.0, 3.0], &[1.0, 0.0]), vec![2.0]);
    }
}
