//! Test helpers shared by the networks' tests: the gradient against finite differences, and a
//! fused step against the gradient followed by the update.

/// The worst relative error, over every parameter, between `grad` and central finite
/// differences (step 1e-3) of `loss_at` around `params`: |numeric - analytic| / (1e-2 +
/// max(|numeric|, |analytic|)).
pub fn worst_relative_error(
    params: &[f32],
    grad: &[f32],
    mut loss_at: impl FnMut(&[f32]) -> f64,
) -> f64 {
    let h = 1e-3f32;
    let mut worst = 0.0f64;
    for i in 0..params.len() {
        let mut plus = params.to_vec();
        let mut minus = params.to_vec();
        plus[i] += h;
        minus[i] -= h;
        let numeric = (loss_at(&plus) - loss_at(&minus)) / (2.0 * f64::from(h));
        let analytic = f64::from(grad[i]);
        let err = (numeric - analytic).abs() / (1e-2 + numeric.abs().max(analytic.abs()));
        worst = worst.max(err);
    }
    worst
}

/// Asserts that `stepped` is w - eta g for every parameter w of `params` and g of `grad`.
pub fn assert_step(stepped: &[f32], params: &[f32], grad: &[f32], eta: f32) {
    for ((s, p), g) in stepped.iter().zip(params).zip(grad) {
        assert!(
            (s - (p - eta * g)).abs() <= 1e-6 * (1.0 + p.abs()),
            "{s} vs {}",
            p - eta * g
        );
    }
}
