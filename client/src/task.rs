//! The checks of a round's task against this client's data and its own privacy requirements.

use crate::local_round::{AdmmStep, Work};
use crate::{ClientPrivacy, LocalData};
use fl_common::model::{LocalConfig, ModelSpec};
use fl_common::privacy::LocalMechanism;
use fl_common::secagg::check_combination;
use fl_proto::v1::{RoundTask, SecAggTask};

/// Checks that a task fits this client's data; returns the model and training settings.
fn check_model(
    task: &RoundTask,
    local: &LocalData,
    num_values: usize,
) -> Result<(ModelSpec, LocalConfig), String> {
    let spec = ModelSpec::try_from(task.model.as_ref().ok_or("task without a model spec")?)
        .map_err(|e| e.to_string())?;
    let config = LocalConfig::from(task.config.ok_or("task without a local config")?);
    if spec.num_params() != num_values {
        return Err(format!(
            "model {spec} has {} parameters but {num_values} were sent",
            spec.num_params()
        ));
    }
    if spec.inputs() != local.data.num_features() {
        return Err(format!(
            "model takes {} features, local data has {}",
            spec.inputs(),
            local.data.num_features()
        ));
    }
    if local
        .indices
        .iter()
        .any(|&i| local.data.labels()[i] as usize >= spec.classes())
    {
        return Err(format!(
            "local data has labels beyond the model's {} classes",
            spec.classes()
        ));
    }
    config
        .check()
        .map_err(|e| format!("unusable local config {config:?}: {e}"))?;
    Ok((spec, config))
}

/// Checks a task against this client's data and its own privacy requirements, and decides how
/// to do the round: the local work, and the secure-aggregation task that follows it, if any. The
/// client never uploads with less protection than it requires: its limits only tighten the
/// round's mechanism, and a round of another kind is refused.
pub(crate) fn plan_round(
    task: &RoundTask,
    local: &LocalData,
    num_values: usize,
    own: &ClientPrivacy,
) -> Result<(Work, Option<SecAggTask>), String> {
    let factor = if task.admm.is_some() { 2 } else { 1 };
    if !num_values.is_multiple_of(factor) {
        return Err(format!("an IADMM task cannot carry {num_values} values"));
    }
    let (spec, config) = check_model(task, local, num_values / factor)?;
    let mechanism = task
        .local_privacy
        .as_ref()
        .map(LocalMechanism::try_from)
        .transpose()
        .map_err(|e| e.to_string())?;
    let asked = mechanism.map_or("none", |m| m.name());
    if let Some(required) = own.require
        && required.name() != asked
    {
        return Err(format!(
            "this client uploads only with {}; the round asks for {asked}",
            required.name()
        ));
    }
    if task.secagg.is_some() {
        check_combination(mechanism.is_some(), task.admm.is_some())?;
    }
    let mechanism = mechanism.map(|m| m.tightened(&own.limits));
    if let Some(m) = &mechanism {
        m.check(spec.num_params()).map_err(|e| e.to_string())?;
    }
    let admm = match task.admm {
        None => None,
        Some(a) if a.rho > 0.0 && a.rho.is_finite() && a.total_examples > 0 => Some(AdmmStep {
            rho: a.rho,
            total_examples: a.total_examples,
        }),
        Some(a) => {
            return Err(format!(
                "unusable IADMM step rho = {}, I = {}",
                a.rho, a.total_examples
            ));
        }
    };
    let work = Work {
        spec,
        config,
        mechanism,
        admm,
    };
    Ok((work, task.secagg))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local_round;
    use fl_common::data::Dataset;
    use fl_common::privacy::Release;
    use fl_common::privacy::{ClientLimits, ReleaseKind};
    use fl_proto::v1::{GaussianLdp, LaplaceLdp, LocalPrivacy, local_privacy};
    use std::sync::Arc;

    fn local() -> LocalData {
        let features = ndarray::Array2::from_shape_fn((6, 3), |(i, j)| (i + j) as f32);
        let data = Dataset::new(features, vec![0, 1, 0, 1, 0, 1], 2).unwrap();
        LocalData {
            data: Arc::new(data),
            indices: (0..6).collect(),
        }
    }

    fn task(mechanism: Option<local_privacy::Mechanism>) -> RoundTask {
        let spec = ModelSpec::logistic(3, 2).unwrap();
        RoundTask {
            round: 1,
            model: Some((&spec).into()),
            config: Some(
                LocalConfig {
                    epochs: 1,
                    batch_size: 2,
                    learning_rate: 0.1,
                }
                .into(),
            ),
            num_values: 8,
            num_chunks: 1,
            secagg: None,
            local_privacy: mechanism.map(|m| LocalPrivacy { mechanism: Some(m) }),
            admm: None,
        }
    }

    fn gaussian(epsilon: f64) -> Option<local_privacy::Mechanism> {
        Some(local_privacy::Mechanism::Gaussian(GaussianLdp {
            epsilon,
            delta: 1e-5,
            clip_bound: 1.0,
        }))
    }

    #[test]
    fn a_client_refuses_rounds_below_its_requirements_and_tightens_the_rest() {
        let follow = ClientPrivacy::default();
        let err = plan_round(&task(gaussian(0.0)), &local(), 8, &follow).err();
        assert!(err.unwrap().contains("local epsilon = 0"));
        let laplace_only = ClientPrivacy {
            require: Some(ReleaseKind::Laplace),
            ..ClientPrivacy::default()
        };
        let err = plan_round(&task(gaussian(2.0)), &local(), 8, &laplace_only).err();
        assert!(err.unwrap().contains("uploads only with ldp-laplace"));
        let err = plan_round(&task(None), &local(), 8, &laplace_only).err();
        assert!(err.unwrap().contains("the round asks for none"));
        let strict = ClientPrivacy {
            require: Some(ReleaseKind::Laplace),
            limits: ClientLimits {
                epsilon: Some(0.5),
                ..ClientLimits::default()
            },
        };
        let laplace = Some(local_privacy::Mechanism::Laplace(LaplaceLdp {
            epsilon: 2.0,
            clip_bound: 1.0,
        }));
        let (work, secagg) = plan_round(&task(laplace), &local(), 8, &strict).unwrap();
        assert!(secagg.is_none());
        assert_eq!(
            work.mechanism,
            Some(LocalMechanism::Laplace {
                epsilon: 0.5,
                clip: 1.0
            })
        );
        // The upload carries the tightened loss, which the round admits.
        let upload = local_round::compute(&work, &[0.0; 8], &local(), 1).unwrap();
        let release: &Release = upload.release().unwrap();
        assert_eq!(release.epsilon, 0.5);
        let round = LocalMechanism::Laplace {
            epsilon: 2.0,
            clip: 1.0,
        };
        round.admits(release).unwrap();
    }
}
