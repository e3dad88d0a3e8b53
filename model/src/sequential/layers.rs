//! The layers of a convolutional network as the configuration names them, and their shapes and
//! places in the flat parameter vector once the input's shape is known.

use crate::MAX_PARAMS;
pub use fl_datasets::Shape;

/// One layer of a network, as `[model] layers` lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum LayerSpec {
    /// 2-D convolution, `conv:CHANNELS:KERNEL[:strideS][:padP]`: a square kernel, stride S
    /// (default 1), P zeros around the input on every side (default 0).
    Conv {
        /// Output channels.
        channels: usize,
        /// Kernel height and width.
        kernel: usize,
        /// Step between windows.
        stride: usize,
        /// Zero padding on each side.
        pad: usize,
    },
    /// max(0, x), `relu`.
    Relu,
    /// tanh(x), `tanh`: a bounded activation, which Papernot et al. 2021 ("Tempered Sigmoid
    /// Activations for Deep Learning with Differential Privacy") found to keep more accuracy
    /// than ReLU under clipping and noise.
    Tanh,
    /// Max pooling over non-overlapping square windows, `maxpool:SIZE` (a remainder is dropped).
    MaxPool {
        /// Window height, width and stride.
        size: usize,
    },
    /// The example as one vector, `flatten` (dense layers flatten their input anyway).
    Flatten,
    /// Fully connected, `dense:UNITS`.
    Dense {
        /// Output width.
        units: usize,
    },
}

impl std::str::FromStr for LayerSpec {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let mut parts = text.split(':');
        let kind = parts.next().unwrap_or_default();
        let numbers: Vec<&str> = parts.collect();
        let positive = |s: &str, what: &str| match s.parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(format!("{what} must be a positive integer, got {s:?}")),
        };
        match (kind, numbers.as_slice()) {
            ("relu", []) => Ok(Self::Relu),
            ("tanh", []) => Ok(Self::Tanh),
            ("flatten", []) => Ok(Self::Flatten),
            ("maxpool", [size]) => Ok(Self::MaxPool {
                size: positive(size, "the pooling size")?,
            }),
            ("dense", [units]) => Ok(Self::Dense {
                units: positive(units, "the number of units")?,
            }),
            ("conv", [channels, kernel, options @ ..]) => {
                let mut layer = Self::Conv {
                    channels: positive(channels, "the number of channels")?,
                    kernel: positive(kernel, "the kernel size")?,
                    stride: 1,
                    pad: 0,
                };
                let Self::Conv { stride, pad, .. } = &mut layer else {
                    unreachable!("built as a convolution above")
                };
                for option in options {
                    if let Some(s) = option.strip_prefix("stride") {
                        *stride = positive(s, "the stride")?;
                    } else if let Some(p) = option.strip_prefix("pad") {
                        *pad = p
                            .parse()
                            .map_err(|_| format!("the padding must be an integer, got {p:?}"))?;
                    } else {
                        return Err(format!("unknown option {option:?} (strideS or padP)"));
                    }
                }
                Ok(layer)
            }
            _ => Err(
                "not a layer: conv:C:K[:strideS][:padP], relu, maxpool:S, flatten or \
                 dense:N"
                    .into(),
            ),
        }
    }
}

impl std::fmt::Display for LayerSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Self::Conv {
                channels,
                kernel,
                stride,
                pad,
            } => {
                write!(f, "conv:{channels}:{kernel}")?;
                if stride != 1 {
                    write!(f, ":stride{stride}")?;
                }
                if pad != 0 {
                    write!(f, ":pad{pad}")?;
                }
                Ok(())
            }
            Self::Relu => write!(f, "relu"),
            Self::Tanh => write!(f, "tanh"),
            Self::MaxPool { size } => write!(f, "maxpool:{size}"),
            Self::Flatten => write!(f, "flatten"),
            Self::Dense { units } => write!(f, "dense:{units}"),
        }
    }
}

/// A layer placed in a network: its shapes and, for convolutions and dense layers, where its
/// weights W (fan-in x outputs, row-major) and bias b lie in the flat parameter vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placed {
    /// What the layer is.
    pub spec: LayerSpec,
    /// One example's input.
    pub input: Shape,
    /// One example's output.
    pub output: Shape,
    /// Offset of W, for a layer with parameters.
    pub weight_offset: usize,
    /// Offset of b (equal to `weight_offset` for a layer without parameters).
    pub bias_offset: usize,
}

impl Placed {
    /// Rows of W: the values one output is computed from (k * k * C_in for a convolution).
    pub fn fan_in(&self) -> usize {
        (self.bias_offset - self.weight_offset) / self.outputs_per_position().max(1)
    }

    /// Columns of W: output channels or units; 0 for a layer without parameters.
    pub fn outputs_per_position(&self) -> usize {
        match self.spec {
            LayerSpec::Conv { .. } | LayerSpec::Dense { .. } => self.output.channels,
            _ => 0,
        }
    }

    /// Values the layer keeps per example in a pass: its output, and a convolution's patch
    /// matrix (one row of fan-in values per output position).
    pub fn values_per_example(&self) -> usize {
        let patches = match self.spec {
            LayerSpec::Conv { .. } => {
                (self.output.height * self.output.width).saturating_mul(self.fan_in())
            }
            _ => 0,
        };
        self.output.len().saturating_add(patches)
    }

    /// The end of the layer's parameters.
    pub fn end(&self) -> usize {
        self.bias_offset + self.outputs_per_position()
    }
}

/// Most layers in a network; with [`MAX_PARAMS`] and [`MAX_ACTIVATIONS`] it bounds what a
/// network sent by a peer can make us allocate.
pub const MAX_LAYERS: usize = 256;

/// Most values one example's activations and patch matrices may take over the whole network
/// (2^24 f32, 64 MiB): a network can have few parameters and yet huge activations.
pub const MAX_ACTIVATIONS: usize = 1 << 24;

/// Places `layers` after an input of shape `input`; refuses a layer that cannot follow the one
/// before it, naming it (its position from 0 and its text).
pub fn place(input: Shape, layers: &[LayerSpec]) -> Result<Vec<Placed>, String> {
    if layers.is_empty() || layers.len() > MAX_LAYERS {
        return Err(format!(
            "a network has 1 to {MAX_LAYERS} layers, not {}",
            layers.len()
        ));
    }
    if input.is_empty() || input.len() > MAX_ACTIVATIONS {
        return Err(format!("an input of {} values per example", input.len()));
    }
    let mut activations = 0usize;
    let mut placed = Vec::with_capacity(layers.len());
    let mut shape = input;
    let mut offset = 0usize;
    for (i, &spec) in layers.iter().enumerate() {
        let named = |why: String| format!("layer {i} ({spec}): {why}");
        let (output, weights) = output_shape(spec, shape).map_err(named)?;
        let bias_offset = offset
            .checked_add(weights)
            .filter(|&n| n <= MAX_PARAMS)
            .ok_or_else(|| named("the network has too many parameters".into()))?;
        let layer = Placed {
            spec,
            input: shape,
            output,
            weight_offset: offset,
            bias_offset,
        };
        offset = layer.end();
        if offset > MAX_PARAMS {
            return Err(named("the network has too many parameters".into()));
        }
        activations = activations.saturating_add(layer.values_per_example());
        if activations > MAX_ACTIVATIONS {
            return Err(named(format!(
                "the activations exceed {MAX_ACTIVATIONS} values per example"
            )));
        }
        placed.push(layer);
        shape = output;
    }
    Ok(placed)
}

/// The output shape of `spec` on `input`, and the number of its weights (without the bias).
fn output_shape(spec: LayerSpec, input: Shape) -> Result<(Shape, usize), String> {
    match spec {
        LayerSpec::Conv {
            channels,
            kernel,
            stride,
            pad,
        } => {
            let span = |n: usize| {
                pad.checked_mul(2)
                    .and_then(|p| p.checked_add(n))
                    .ok_or_else(|| format!("a padding of {pad} is too large"))?
                    .checked_sub(kernel)
                    .map(|room| room / stride + 1)
                    .ok_or_else(|| {
                        format!("a {kernel}x{kernel} kernel does not fit a padded input of {n}")
                    })
            };
            let output = Shape {
                height: span(input.height)?,
                width: span(input.width)?,
                channels,
            };
            let values = (output.height.checked_mul(output.width))
                .and_then(|n| n.checked_mul(channels))
                .filter(|&n| n <= MAX_ACTIVATIONS);
            if values.is_none() {
                return Err(format!(
                    "the activations exceed {MAX_ACTIVATIONS} values per example"
                ));
            }
            let weights = (kernel.checked_mul(kernel))
                .and_then(|n| n.checked_mul(input.channels))
                .and_then(|n| n.checked_mul(channels))
                .ok_or("too many weights")?;
            Ok((output, weights))
        }
        LayerSpec::MaxPool { size } => match (input.height / size, input.width / size) {
            (0, _) | (_, 0) => Err(format!(
                "a {size}x{size} window does not fit an input of {}x{}",
                input.height, input.width
            )),
            (height, width) => Ok((
                Shape {
                    height,
                    width,
                    channels: input.channels,
                },
                0,
            )),
        },
        LayerSpec::Relu | LayerSpec::Tanh => Ok((input, 0)),
        LayerSpec::Flatten => Ok((Shape::flat(input.len()), 0)),
        LayerSpec::Dense { units } => {
            let weights = input.len().checked_mul(units).ok_or("too many weights")?;
            Ok((Shape::flat(units), weights))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(list: &[&str]) -> Vec<LayerSpec> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    #[test]
    fn the_fedavg_cnn_has_mcmahan_et_al_s_parameter_count() {
        let layers = parse(&super::super::FEDAVG_CNN);
        let input = Shape {
            height: 28,
            width: 28,
            channels: 1,
        };
        let placed = place(input, &layers).unwrap();
        // McMahan et al. 2017, Section 3: 1,663,370 parameters.
        assert_eq!(placed.last().unwrap().end(), 1_663_370);
        assert_eq!(
            placed[5].output,
            Shape {
                height: 7,
                width: 7,
                channels: 64
            }
        );
        assert_eq!(placed[3].fan_in(), 5 * 5 * 32);
    }

    #[test]
    fn lenet5_has_its_parameter_count() {
        let input = Shape {
            height: 28,
            width: 28,
            channels: 1,
        };
        let placed = place(input, &parse(&super::super::LENET5)).unwrap();
        // 156 + 2,416 + 48,120 + 10,164 + 850
        assert_eq!(placed.last().unwrap().end(), 61_706);
        assert_eq!(placed[6].input.len(), 16 * 5 * 5);
    }

    #[test]
    fn layer_texts_parse_and_print_back() {
        for text in [
            "conv:6:5:stride2:pad1",
            "relu",
            "maxpool:2",
            "flatten",
            "dense:84",
        ] {
            let layer: LayerSpec = text.parse().unwrap();
            assert_eq!(layer.to_string().parse::<LayerSpec>().unwrap(), layer);
        }
        assert_eq!(
            "conv:6:5".parse::<LayerSpec>().unwrap(),
            LayerSpec::Conv {
                channels: 6,
                kernel: 5,
                stride: 1,
                pad: 0
            }
        );
    }

    #[test]
    fn bad_layers_are_refused_with_the_reason() {
        for (text, says) in [
            ("conv:0:5", "channels"),
            ("conv:6", "not a layer"),
            ("conv:6:5:dilate2", "unknown option"),
            ("maxpool:x", "pooling size"),
            ("dense", "not a layer"),
            ("softmax", "not a layer"),
        ] {
            let e = text.parse::<LayerSpec>().unwrap_err();
            assert!(e.contains(says), "{text}: {e}");
        }
    }

    #[test]
    fn a_layer_that_cannot_follow_is_named() {
        let input = Shape {
            height: 4,
            width: 4,
            channels: 1,
        };
        let e = place(input, &parse(&["maxpool:2", "conv:3:5"])).unwrap_err();
        assert!(e.starts_with("layer 1 (conv:3:5)"), "{e}");
        let e = place(input, &parse(&["maxpool:8"])).unwrap_err();
        assert!(e.starts_with("layer 0 (maxpool:8)"), "{e}");
        let e = place(input, &parse(&["dense:100000", "dense:100000"])).unwrap_err();
        assert!(e.contains("too many parameters"), "{e}");
        // Few parameters, 2^24 activations per example.
        let e = place(input, &parse(&["conv:1048576:1"])).unwrap_err();
        assert!(e.starts_with("layer 0 (conv:1048576:1)"), "{e}");
        assert!(e.contains("activations"), "{e}");
        let e = place(input, &vec![LayerSpec::Relu; MAX_LAYERS + 1]).unwrap_err();
        assert!(e.contains("layers"), "{e}");
    }
}
