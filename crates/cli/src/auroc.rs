//! The area under the ROC curve: how well a score ranks one class above the other.

/// The area under the ROC curve of `scores` for the positives in `label` (ties count half);
/// `None` when either class is empty.
pub fn auroc(scores: &[f64], label: &[bool]) -> Option<f64> {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[a].total_cmp(&scores[b]));
    let (mut rank_sum, mut i) = (0.0, 0);
    while i < order.len() {
        let mut j = i;
        while j + 1 < order.len() && scores[order[j + 1]] == scores[order[i]] {
            j += 1;
        }
        let mid_rank = (i + j) as f64 / 2.0 + 1.0;
        rank_sum += (i..=j).filter(|&k| label[order[k]]).count() as f64 * mid_rank;
        i = j + 1;
    }
    let pos = label.iter().filter(|&&l| l).count() as f64;
    let neg = label.len() as f64 - pos;
    (pos > 0.0 && neg > 0.0).then(|| (rank_sum - pos * (pos + 1.0) / 2.0) / (pos * neg))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auroc_counts_pairs_ranked_right_and_ties_as_half() {
        assert_eq!(
            auroc(&[0.1, 0.2, 0.8, 0.9], &[false, false, true, true]),
            Some(1.0)
        );
        assert_eq!(
            auroc(&[0.9, 0.8, 0.2, 0.1], &[false, false, true, true]),
            Some(0.0)
        );
        assert_eq!(auroc(&[0.5, 0.5], &[false, true]), Some(0.5));
        // Pairs (pos, neg): (0.7 > 0.4) yes, (0.7 > 0.8) no, (0.3 > 0.4) no, (0.3 > 0.8) no.
        assert_eq!(
            auroc(&[0.7, 0.3, 0.4, 0.8], &[true, true, false, false]),
            Some(0.25)
        );
        assert_eq!(auroc(&[0.1], &[true]), None);
    }
}
