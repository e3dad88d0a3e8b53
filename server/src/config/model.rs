//! `[model]`: the architecture.

use super::ConfigError;
use fl_model::{LayerSpec, ModelSpec, Shape, sequential};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The kind of model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ModelKind {
    /// Multinomial logistic regression.
    Logistic,
    /// Fully connected ReLU network, with biases, of `hidden` widths.
    Mlp,
    /// Convolutional network of the listed `layers`.
    Cnn,
    /// McMahan et al. 2017's CNN: two 5x5 convolutions of 32 and 64 channels, each with 2x2 max
    /// pooling, then dense 512 (1,663,370 parameters on MNIST; [`sequential::FEDAVG_CNN`]).
    FedavgCnn,
    /// LeNet-5 as MindSpore Federated trains it (61,706 parameters; [`sequential::LENET5`]).
    Lenet5,
    /// A model only the clients' own code knows (e.g. a PyTorch `nn.Module`), defined by the
    /// f32 tensors of `init`. The server loads no test set for it and writes `test_accuracy` as
    /// null (use `eval.federated`); the built-in trainer (`fl-client`, `fl sim`), IADMM and
    /// `ldp-laplace` refuse it.
    External,
}

impl std::str::FromStr for ModelKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        // serde lists the kinds from the enum itself: "unknown variant `x`, expected one of ...".
        Self::deserialize(toml::Value::String(s.into()))
            .map_err(|e| e.to_string().replace("unknown variant", "unknown model"))
    }
}

/// `[model]`: the architecture. The input's shape and the classes come from the dataset.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ModelSection {
    /// `mlp`, `logistic`, `cnn`, a named CNN (`fedavg-cnn`, `lenet5`), or `external`.
    pub kind: ModelKind,
    /// Hidden widths of the MLP (the Geyer et al. default 600, 100).
    pub hidden: Vec<usize>,
    /// The layers of a `cnn`, in order, e.g. `["conv:32:5:pad2", "relu", "maxpool:2",
    /// "dense:10"]`: `conv:C:K[:strideS][:padP]` (C channels, K x K kernel, stride S, P zeros
    /// each side), `relu`, `tanh` (bounded, which Papernot et al. 2021 found keeps more accuracy
    /// under DP noise), `maxpool:S`, `flatten`, `dense:N`; the last is dense with one unit per
    /// class. The input's shape comes from the data (28 x 28 x 1 for MNIST; a CSV row is a flat
    /// vector). A bad list stops the start, naming the position and text of the layer at fault.
    pub layers: Vec<String>,
    /// Starting weights: a safetensors file with the network's tensor names and shapes (as the
    /// run's `model.safetensors` has them), all of them and no others, or the start is refused
    /// naming the tensor. Without it the weights are drawn afresh. For an `external` model it is
    /// required: its tensors (all f32; an integer buffer such as BatchNorm's
    /// `num_batches_tracked` is refused by name) are the model, and a resumed run reads their
    /// names and shapes from it again.
    pub init: Option<PathBuf>,
}

impl Default for ModelSection {
    fn default() -> Self {
        Self {
            kind: ModelKind::Mlp,
            hidden: vec![600, 100],
            layers: Vec::new(),
            init: None,
        }
    }
}

impl ModelSection {
    /// Whether the model is one only the clients' code knows.
    pub fn is_external(&self) -> bool {
        self.kind == ModelKind::External
    }

    /// The architecture for examples of shape `input` and `classes` classes.
    pub fn spec(&self, input: Shape, classes: usize) -> Result<ModelSpec, ConfigError> {
        let invalid = |e: String| ConfigError::Invalid(format!("model: {e}"));
        match self.kind {
            ModelKind::External => {
                return Err(invalid(
                    "an external model has no built-in architecture".into(),
                ));
            }
            ModelKind::Logistic => ModelSpec::logistic(input.len(), classes),
            ModelKind::Mlp => ModelSpec::mlp(input.len(), &self.hidden, classes),
            ModelKind::Cnn | ModelKind::FedavgCnn | ModelKind::Lenet5 => {
                let mut layers = self.conv_layers().map_err(invalid)?;
                let last = layers.len() - 1;
                match (&mut layers[last], self.kind) {
                    // A named network ends in one unit per class of the data.
                    (LayerSpec::Dense { units }, ModelKind::FedavgCnn | ModelKind::Lenet5) => {
                        *units = classes;
                    }
                    (&mut LayerSpec::Dense { units }, _) if units != classes => {
                        return Err(invalid(format!(
                            "layer {last} (dense:{units}): the last layer needs one unit per \
                             class, and the data has {classes}"
                        )));
                    }
                    _ => {}
                }
                ModelSpec::sequential(input, &layers)
            }
        }
        .map_err(|e| invalid(e.to_string()))
    }

    /// The layer list of a convolutional kind, parsed; a bad text is named.
    fn conv_layers(&self) -> Result<Vec<LayerSpec>, String> {
        let texts: Vec<&str> = match self.kind {
            ModelKind::Cnn => self.layers.iter().map(String::as_str).collect(),
            ModelKind::FedavgCnn => sequential::FEDAVG_CNN.to_vec(),
            ModelKind::Lenet5 => sequential::LENET5.to_vec(),
            ModelKind::Logistic | ModelKind::Mlp | ModelKind::External => Vec::new(),
        };
        if texts.is_empty() {
            return Err("kind = \"cnn\" needs its `layers`".into());
        }
        (texts.iter().enumerate())
            .map(|(i, text)| {
                text.parse()
                    .map_err(|e| format!("layer {i} ({text:?}): {e}"))
            })
            .collect()
    }

    /// Checks what does not depend on the data: the kind's settings, and every layer's text.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |e: String| Err(ConfigError::Invalid(e));
        match self.kind {
            ModelKind::Mlp if self.hidden.is_empty() => {
                invalid("model.hidden must list at least one width for an mlp".into())
            }
            ModelKind::Cnn => {
                (self.conv_layers().map(drop)).or_else(|e| invalid(format!("model.layers: {e}")))
            }
            ModelKind::External if self.init.is_none() => invalid(
                "model.kind = \"external\" needs model.init: a safetensors file of the model's \
                 f32 tensors (e.g. safetensors.torch.save_file(model.state_dict(), ...))"
                    .into(),
            ),
            _ if !self.layers.is_empty() => {
                invalid("model.layers is for kind = \"cnn\" (the other kinds fix theirs)".into())
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RunConfig;

    fn refused(c: &RunConfig) -> String {
        c.validate().unwrap_err().to_string()
    }

    /// An unknown kind is refused with every kind the enum has, which nobody lists by hand.
    #[test]
    fn an_unknown_model_kind_names_every_kind() {
        let said = "resnet".parse::<ModelKind>().unwrap_err();
        assert!(said.starts_with("unknown model `resnet`"), "{said}");
        for kind in [ModelKind::Logistic, ModelKind::Lenet5, ModelKind::External] {
            let name = toml::Value::try_from(kind).unwrap().to_string();
            assert!(said.contains(name.trim_matches('"')), "{said} lacks {name}");
        }
        assert_eq!("fedavg-cnn".parse::<ModelKind>(), Ok(ModelKind::FedavgCnn));
    }

    /// A bad layer list stops the start naming the layer: its text at validation, its fit to the
    /// data's shape and classes when the network is built.
    #[test]
    fn cnn_layers_are_checked_and_named() {
        let cnn = |layers: &str| {
            toml::from_str::<RunConfig>(&format!("[model]\nkind = \"cnn\"\nlayers = {layers}\n"))
                .unwrap()
        };
        let digit = Shape {
            height: 28,
            width: 28,
            channels: 1,
        };
        let e = refused(&cnn(
            r#"["conv:8:5", "relu", "maxpool:2", "conv:16:x", "dense:10"]"#,
        ));
        assert!(e.contains(r#"model.layers: layer 3 ("conv:16:x")"#), "{e}");
        assert!(refused(&cnn("[]")).contains("needs its `layers`"));
        let wrong_classes = cnn(r#"["conv:8:5", "relu", "dense:5"]"#);
        wrong_classes.validate().unwrap();
        let e = wrong_classes.model.spec(digit, 10).unwrap_err().to_string();
        assert!(e.contains("layer 2 (dense:5)") && e.contains("10"), "{e}");
        let too_big = cnn(r#"["conv:8:5", "maxpool:32", "dense:10"]"#);
        let e = too_big.model.spec(digit, 10).unwrap_err().to_string();
        assert!(e.contains("layer 1 (maxpool:32)"), "{e}");
        let mut mlp_with_layers = cnn(r#"["dense:10"]"#);
        mlp_with_layers.model.kind = ModelKind::Mlp;
        assert!(refused(&mlp_with_layers).contains("model.layers is for kind"));
        // The named networks end in the data's classes.
        let mut lenet = RunConfig::default();
        lenet.model.kind = "lenet5".parse().unwrap();
        lenet.validate().unwrap();
        let spec = lenet.model.spec(digit, 3).unwrap();
        assert_eq!((spec.classes(), spec.num_params()), (3, 61_706 - 7 * 85));
        assert!("resnet".parse::<ModelKind>().is_err());
    }

    /// An external model needs its file, and the modes that need the built-in trainer refuse it.
    #[test]
    fn an_external_model_needs_its_file_and_the_users_trainer() {
        let mut c = RunConfig::default();
        c.model.kind = "external".parse().unwrap();
        assert!(refused(&c).contains("needs model.init"));
        c.model.init = Some("start.safetensors".into());
        c.validate().unwrap();
        for (algorithm, mode) in [("iadmm", "none"), ("fedavg", "ldp-laplace")] {
            let mut bad = c.clone();
            bad.train.algorithm = toml::Value::String(algorithm.into()).try_into().unwrap();
            bad.privacy.mode = toml::Value::String(mode.into()).try_into().unwrap();
            assert!(refused(&bad).contains("cannot train model.kind"), "{mode}");
        }
        c.model.layers = vec!["dense:10".into()];
        assert!(refused(&c).contains("model.layers is for kind"));
    }
}
