//! Fitting a [`QualityModel`] to graded answers: L2-penalised logistic regressions, by
//! full-batch gradient descent from zero, so the same examples give the same model.

use crate::rng::SplitMix;

use super::{
    DEFAULT_PRE_GENERATION_SHARE, DIM, EdgeSignals, FEATURE_NAMES, FORMAT, Logistic, QualityError,
    QualityModel, StateProbe, TEXT_DIM, edge_features, sigmoid,
};

/// One training example: the features of a request, what the edge model's state said after
/// prefill, and whether its answer was right.
#[derive(Debug, Clone, PartialEq)]
pub struct Example {
    pub text: [f32; TEXT_DIM],
    pub edge: EdgeSignals,
    /// The final hidden state at the prompt's last position; empty where none was read.
    pub state: Vec<f32>,
    pub edge_ok: bool,
}

/// The L2 penalty on the scalar features, per example: strong enough that a handful of
/// features cannot overfit a few hundred examples, weak enough to leave the real effects.
const L2_SCALARS: f32 = 0.02;

/// The L2 penalty on the weights of the state's principal directions: standardised like
/// the scalars, and penalised alike.
const L2_STATE: f32 = L2_SCALARS;

/// How many of the hidden state's principal directions the probe reads. Hundreds of raw
/// elements fitted to a few thousand answers learn which kind of prompt the edge fails, not
/// which prompt of a kind; a few leading directions carry across sets. Chosen by leaving
/// each training set out in turn (`--examples-out`; BENCHMARKS.md, "The state probe on
/// principal directions").
const STATE_DIRECTIONS: usize = 16;

/// Rounds of orthogonal iteration: the leading directions of a hidden state settle in tens.
const PCA_ROUNDS: usize = 40;

/// Gradient steps: enough for standardised features to converge.
const STEPS: usize = 1500;

/// Fits every regression the examples allow (the state probe where every example has a
/// state of one width) and names the edge model they were fitted for.
pub fn train(
    examples: &[Example],
    edge_model_sha256: &str,
    provenance: &str,
) -> Result<QualityModel, QualityError> {
    let positives = examples.iter().filter(|e| e.edge_ok).count();
    if positives == 0 || positives == examples.len() {
        return Err(QualityError::OneSidedLabels);
    }
    let rows: Vec<Vec<f32>> = examples.iter().map(scalar_vector).collect();
    let (mean, scale) = standardisation(&rows);
    let z: Vec<Vec<f32>> = rows
        .iter()
        .map(|r| standardised(r, &mean, &scale))
        .collect();
    let y: Vec<f32> = examples
        .iter()
        .map(|e| f32::from(u8::from(e.edge_ok)))
        .collect();
    let text_rows: Vec<&[f32]> = z.iter().map(|r| &r[..TEXT_DIM]).collect();
    let all_rows: Vec<&[f32]> = z.iter().map(|r| &r[..]).collect();
    let text_only = fit(&text_rows, &y, &[L2_SCALARS; TEXT_DIM]);
    let with_edge = fit(&all_rows, &y, &[L2_SCALARS; DIM]);
    let with_state = state_probe(examples, &z, &y);
    let mut model = QualityModel {
        format: FORMAT.into(),
        version: String::new(),
        edge_model_sha256: edge_model_sha256.to_ascii_lowercase(),
        provenance: provenance.into(),
        features: FEATURE_NAMES.iter().map(|s| s.to_string()).collect(),
        mean,
        scale,
        text_only,
        with_edge,
        with_state,
        pre_generation_share: DEFAULT_PRE_GENERATION_SHARE,
    };
    model.version = version(&model);
    Ok(model)
}

/// The shares of the first-token bar [`with_pre_generation_share`] weighs, lowest first.
pub(super) const PRE_GENERATION_SHARES: [f64; 5] = [0.5, 0.6, 0.7, 0.8, 0.9];

/// Of the requests a share sends up before prefill, at most this fraction may be ones the
/// state probe would have kept on the edge at the whole bar: a request sent up unprefilled
/// never gets the state's second look, so a share that loses more sends up answers the edge
/// would have given.
const MAX_KEPT_OF_SENT_UP: f64 = 0.01;

/// What one pre-generation share does to a set of training answers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ShareRow {
    pub share: f64,
    /// Requests whose text alone falls below `share` × the bar: sent up unprefilled.
    pub sent_up: usize,
    /// Of those, how many the state probe would have kept at the whole bar.
    pub kept: usize,
    /// Of the kept, how many the edge answered right.
    pub kept_right: usize,
}

impl ShareRow {
    /// Whether the share loses at most [`MAX_KEPT_OF_SENT_UP`] of what it sends up.
    pub fn qualifies(&self) -> bool {
        self.kept as f64 <= MAX_KEPT_OF_SENT_UP * self.sent_up as f64
    }
}

/// [`ShareRow`]s for each of [`PRE_GENERATION_SHARES`] at the first-token `bar`.
fn share_rows(model: &QualityModel, examples: &[Example], bar: f64) -> Vec<ShareRow> {
    PRE_GENERATION_SHARES
        .iter()
        .map(|&share| {
            let up: Vec<&Example> = examples
                .iter()
                .filter(|e| model.estimate(&e.text, None, None).p_edge_ok < share * bar)
                .collect();
            let kept: Vec<&&Example> = up
                .iter()
                .filter(|e| {
                    model
                        .estimate(&e.text, Some(e.edge), Some(&e.state))
                        .p_edge_ok
                        >= bar
                })
                .collect();
            ShareRow {
                share,
                sent_up: up.len(),
                kept: kept.len(),
                kept_right: kept.iter().filter(|e| e.edge_ok).count(),
            }
        })
        .collect()
}

/// `model` with the largest pre-generation share that [`ShareRow::qualifies`] on `examples`
/// at `bar` (the lowest where none does), and every share's row, the evidence for it. A
/// larger share spares the device the prefill of what goes up anyway.
pub fn with_pre_generation_share(
    mut model: QualityModel,
    examples: &[Example],
    bar: f64,
) -> (QualityModel, Vec<ShareRow>) {
    let rows = share_rows(&model, examples, bar);
    model.pre_generation_share = rows
        .iter()
        .filter(|r| r.qualifies())
        .map(|r| r.share)
        .fold(PRE_GENERATION_SHARES[0], f64::max);
    model.version = version(&model);
    (model, rows)
}

/// `quality-<edge model>-<fingerprint of the weights and the share>`.
fn version(model: &QualityModel) -> String {
    let short_sha: String = model.edge_model_sha256.chars().take(12).collect();
    let logistics = [&model.text_only, &model.with_edge]
        .into_iter()
        .chain(model.with_state.as_ref().map(|p| &p.model));
    let fingerprint = fingerprint(logistics, model.pre_generation_share);
    format!("quality-{short_sha}-{fingerprint:08x}")
}

/// The probe over the standardised scalars `z` and each example's standardised state, when
/// every example has a state and all have one width. It is fitted on the state's
/// [`STATE_DIRECTIONS`] principal directions, then written back as weights on the whole
/// state (the projection is linear), so the probe that ships is still one dot product.
fn state_probe(examples: &[Example], z: &[Vec<f32>], y: &[f32]) -> Option<StateProbe> {
    let width = examples.first()?.state.len();
    if width == 0 || examples.iter().any(|e| e.state.len() != width) {
        return None;
    }
    let states: Vec<Vec<f32>> = examples.iter().map(|e| e.state.clone()).collect();
    let (mean, scale) = standardisation(&states);
    let zs: Vec<Vec<f32>> = states
        .iter()
        .map(|h| standardised(h, &mean, &scale))
        .collect();
    let basis = principal_directions(&zs, STATE_DIRECTIONS.min(width));
    let projected: Vec<Vec<f32>> = zs.iter().map(|h| project(&basis, h)).collect();
    let (p_mean, p_scale) = standardisation(&projected);
    let rows: Vec<Vec<f32>> = z
        .iter()
        .zip(&projected)
        .map(|(scalars, p)| {
            let mut row = scalars.clone();
            row.extend(standardised(p, &p_mean, &p_scale));
            row
        })
        .collect();
    let rows: Vec<&[f32]> = rows.iter().map(Vec::as_slice).collect();
    let mut l2 = vec![L2_SCALARS; DIM];
    l2.resize(DIM + basis.len(), L2_STATE);
    let on_directions = fit(&rows, y, &l2);
    Some(StateProbe {
        width,
        mean,
        scale,
        model: on_the_state(&on_directions, &basis, &p_mean, &p_scale),
    })
}

/// A regression over the scalars and the standardised projections onto `basis`, as one over
/// the scalars and the standardised state itself.
fn on_the_state(m: &Logistic, basis: &[Vec<f32>], p_mean: &[f32], p_scale: &[f32]) -> Logistic {
    let width = basis.first().map_or(0, Vec::len);
    let (scalars, on_directions) = m.weights.split_at(DIM);
    let mut state = vec![0f32; width];
    let mut bias = m.bias;
    for (d, (w, (pm, ps))) in basis
        .iter()
        .zip(on_directions.iter().zip(p_mean.iter().zip(p_scale)))
    {
        state.iter_mut().zip(d).for_each(|(s, v)| *s += w * v / ps);
        bias -= w * pm / ps;
    }
    Logistic {
        bias,
        weights: scalars.iter().copied().chain(state).collect(),
    }
}

fn project(basis: &[Vec<f32>], h: &[f32]) -> Vec<f32> {
    basis.iter().map(|d| dot(d, h)).collect()
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// The `k` leading principal directions of centred `rows`, orthonormal, by orthogonal
/// iteration from a fixed start (so the same rows give the same directions).
fn principal_directions(rows: &[Vec<f32>], k: usize) -> Vec<Vec<f32>> {
    let width = rows.first().map_or(0, Vec::len);
    let mut rng = SplitMix(0x9e37_79b9_7f4a_7c15);
    let mut q: Vec<Vec<f32>> = (0..k)
        .map(|_| (0..width).map(|_| uniform(&mut rng) - 0.5).collect())
        .collect();
    orthonormalise(&mut q);
    for _ in 0..PCA_ROUNDS {
        let mut next = vec![vec![0f32; width]; k];
        for r in rows {
            for (n, d) in next.iter_mut().zip(&q) {
                let c = dot(r, d);
                n.iter_mut().zip(r).for_each(|(n, x)| *n += c * x);
            }
        }
        orthonormalise(&mut next);
        q = next;
    }
    q
}

/// Modified Gram–Schmidt; a direction the others already span becomes zeros, which projects
/// every state to zero and so carries nothing.
fn orthonormalise(q: &mut [Vec<f32>]) {
    for j in 0..q.len() {
        let (done, rest) = q.split_at_mut(j);
        let v = &mut rest[0];
        for u in done.iter() {
            let c = dot(u, v);
            v.iter_mut().zip(u).for_each(|(v, u)| *v -= c * u);
        }
        let norm = dot(v, v).sqrt();
        let inv = if norm > 1e-6 { 1.0 / norm } else { 0.0 };
        v.iter_mut().for_each(|x| *x *= inv);
    }
}

/// The generator's next value as a float in [0, 1), from its top 24 bits.
fn uniform(rng: &mut SplitMix) -> f32 {
    (rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32
}

/// A short hash of the weights and of a share other than the default (so versions written
/// before models carried a share still read the same), so a retrained model gets a new version.
fn fingerprint<'a>(models: impl Iterator<Item = &'a Logistic>, share: f64) -> u32 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for v in models.flat_map(|m| m.weights.iter().chain([&m.bias])) {
        h = (h ^ u64::from(v.to_bits())).wrapping_mul(0x0100_0000_01b3);
    }
    if share != DEFAULT_PRE_GENERATION_SHARE {
        h = (h ^ share.to_bits()).wrapping_mul(0x0100_0000_01b3);
    }
    h as u32
}

fn scalar_vector(e: &Example) -> Vec<f32> {
    let mut v = e.text.to_vec();
    v.extend(edge_features(e.edge));
    v
}

fn standardised(row: &[f32], mean: &[f32], scale: &[f32]) -> Vec<f32> {
    row.iter()
        .zip(mean.iter().zip(scale))
        .map(|(x, (m, s))| (x - m) / s)
        .collect()
}

/// Each column's mean and standard deviation (1 for a constant column, which carries nothing
/// and so stays harmless).
fn standardisation(rows: &[Vec<f32>]) -> (Vec<f32>, Vec<f32>) {
    let width = rows.first().map_or(0, Vec::len);
    let n = rows.len().max(1) as f64;
    let mut mean = vec![0f64; width];
    for r in rows {
        mean.iter_mut()
            .zip(r)
            .for_each(|(m, &x)| *m += f64::from(x) / n);
    }
    let mut var = vec![0f64; width];
    for r in rows {
        var.iter_mut()
            .zip(r.iter().zip(&mean))
            .for_each(|(v, (&x, m))| *v += (f64::from(x) - m).powi(2) / n);
    }
    let scale = var
        .iter()
        .map(|&v| if v > 1e-8 { v.sqrt() as f32 } else { 1.0 })
        .collect();
    (mean.iter().map(|&m| m as f32).collect(), scale)
}

/// Logistic regression with penalty `l2[j]` on weight `j`, by gradient descent at the
/// largest step that cannot diverge: the logistic loss curves at most a quarter as much as
/// the rows' second moment, whose largest eigenvalue [`largest_eigenvalue`] bounds.
fn fit(rows: &[&[f32]], y: &[f32], l2: &[f32]) -> Logistic {
    let dim = l2.len();
    let n = rows.len().max(1) as f32;
    let curvature = largest_eigenvalue(rows, dim) / 4.0 + l2.iter().copied().fold(0.0, f32::max);
    let step = 1.0 / curvature.max(0.25);
    let (mut w, mut b) = (vec![0f32; dim], 0f32);
    let mut gw = vec![0f32; dim];
    for _ in 0..STEPS {
        gw.fill(0.0);
        let mut gb = 0f32;
        for (r, &t) in rows.iter().zip(y) {
            let z = b + r.iter().zip(&w).map(|(x, w)| x * w).sum::<f32>();
            let err = sigmoid(f64::from(z)) as f32 - t;
            gb += err;
            gw.iter_mut().zip(r.iter()).for_each(|(g, x)| *g += err * x);
        }
        b -= step * gb / n;
        for ((wi, g), l) in w.iter_mut().zip(&gw).zip(l2) {
            *wi -= step * (g / n + l * *wi);
        }
    }
    Logistic {
        bias: b,
        weights: w,
    }
}

/// The largest eigenvalue of the rows' second moment `XᵀX / n` (with the bias's column of
/// ones), by power iteration: an upper bound within a few percent after 30 rounds.
fn largest_eigenvalue(rows: &[&[f32]], dim: usize) -> f32 {
    let n = rows.len().max(1) as f32;
    let mut v = vec![1.0 / ((dim + 1) as f32).sqrt(); dim + 1];
    let mut lambda = 1.0;
    for _ in 0..30 {
        let mut next = vec![0f32; dim + 1];
        for r in rows {
            let xv = v[dim] + r.iter().zip(&v).map(|(x, v)| x * v).sum::<f32>();
            next.iter_mut()
                .zip(r.iter())
                .for_each(|(o, x)| *o += x * xv / n);
            next[dim] += xv / n;
        }
        lambda = next.iter().map(|x| x * x).sum::<f32>().sqrt();
        if lambda <= 0.0 {
            return 1.0;
        }
        v = next.iter().map(|x| x / lambda).collect();
    }
    // Power iteration approaches from below: leave room.
    lambda * 1.1
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows spread widely along the first axis, less along the second, barely elsewhere.
    fn spread_rows() -> Vec<Vec<f32>> {
        let mut rng = SplitMix(7);
        (0..300)
            .map(|_| {
                let mut r: Vec<f32> = (0..6).map(|_| 0.1 * (uniform(&mut rng) - 0.5)).collect();
                r[0] += 10.0 * (uniform(&mut rng) - 0.5);
                r[1] += 3.0 * (uniform(&mut rng) - 0.5);
                r
            })
            .collect()
    }

    #[test]
    fn principal_directions_come_widest_first_and_orthonormal() {
        let q = principal_directions(&spread_rows(), 3);
        assert!(q[0][0].abs() > 0.99, "{:?}", q[0]);
        assert!(q[1][1].abs() > 0.99, "{:?}", q[1]);
        for (i, a) in q.iter().enumerate() {
            for (j, b) in q.iter().enumerate() {
                let want = if i == j { 1.0 } else { 0.0 };
                assert!((dot(a, b) - want).abs() < 1e-4, "{i}·{j}");
            }
        }
        assert_eq!(q, principal_directions(&spread_rows(), 3), "deterministic");
    }

    #[test]
    fn weights_on_the_directions_read_the_same_off_the_whole_state() {
        let basis = principal_directions(&spread_rows(), 2);
        let (p_mean, p_scale) = ([0.3f32, -0.2], [2.0f32, 0.5]);
        let mut weights = vec![0.0; DIM];
        weights.extend([0.7, -1.3]);
        let m = Logistic { bias: 0.4, weights };
        let whole = on_the_state(&m, &basis, &p_mean, &p_scale);
        let z = [0.5f32, -1.0, 2.0, 0.0, 1.5, -0.5];
        let p = project(&basis, &z);
        let direct = m.bias
            + (0..2)
                .map(|k| m.weights[DIM + k] * (p[k] - p_mean[k]) / p_scale[k])
                .sum::<f32>();
        let folded = whole.bias + dot(&whole.weights[DIM..], &z);
        assert!((direct - folded).abs() < 1e-5, "{direct} vs {folded}");
        assert_eq!(whole.weights.len(), DIM + z.len());
    }
}
