//! Fitting a [`QualityModel`] to graded answers: L2-penalised logistic regressions, by
//! full-batch gradient descent from zero, so the same examples give the same model.

use super::{
    DIM, EdgeSignals, FEATURE_NAMES, FORMAT, Logistic, QualityError, QualityModel, StateProbe,
    TEXT_DIM, edge_features, sigmoid,
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

/// The L2 penalty on each of the hidden state's elements: hundreds of correlated elements
/// against a few thousand examples, so stronger than the scalars', or the probe learns the
/// training prompts instead of what makes an answer right. Chosen by leaving each training
/// set out in turn (`--examples-out`): a stronger penalty keeps each set's ranking but loses
/// the ranking across sets, a weaker one loses both.
const L2_STATE: f32 = 0.08;

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
    let short_sha: String = edge_model_sha256.chars().take(12).collect();
    let fingerprint = fingerprint(
        [&text_only, &with_edge]
            .into_iter()
            .chain(with_state.as_ref().map(|p| &p.model)),
    );
    Ok(QualityModel {
        format: FORMAT.into(),
        version: format!("quality-{short_sha}-{fingerprint:08x}"),
        edge_model_sha256: edge_model_sha256.to_ascii_lowercase(),
        provenance: provenance.into(),
        features: FEATURE_NAMES.iter().map(|s| s.to_string()).collect(),
        mean,
        scale,
        text_only,
        with_edge,
        with_state,
    })
}

/// The probe over the standardised scalars `z` and each example's standardised state, when
/// every example has a state and all have one width.
fn state_probe(examples: &[Example], z: &[Vec<f32>], y: &[f32]) -> Option<StateProbe> {
    let width = examples.first()?.state.len();
    if width == 0 || examples.iter().any(|e| e.state.len() != width) {
        return None;
    }
    let states: Vec<Vec<f32>> = examples.iter().map(|e| e.state.clone()).collect();
    let (mean, scale) = standardisation(&states);
    let rows: Vec<Vec<f32>> = z
        .iter()
        .zip(&states)
        .map(|(scalars, h)| {
            let mut row = scalars.clone();
            row.extend(standardised(h, &mean, &scale));
            row
        })
        .collect();
    let rows: Vec<&[f32]> = rows.iter().map(Vec::as_slice).collect();
    let mut l2 = vec![L2_SCALARS; DIM];
    l2.resize(DIM + width, L2_STATE);
    Some(StateProbe {
        width,
        mean,
        scale,
        model: fit(&rows, y, &l2),
    })
}

/// A short hash of the weights, so a retrained model gets a new version.
fn fingerprint<'a>(models: impl Iterator<Item = &'a Logistic>) -> u32 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for v in models.flat_map(|m| m.weights.iter().chain([&m.bias])) {
        h = (h ^ u64::from(v.to_bits())).wrapping_mul(0x0100_0000_01b3);
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
