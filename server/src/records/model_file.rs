//! The model as a file: `model.safetensors` in the run folder, and `model.init`'s starting
//! weights, in one format so that a run's model loads back as another run's start.
//!
//! One f32 tensor per weight matrix and bias, named and shaped as
//! [`fl_model::ModelSpec::named_tensors`] says (`layers.{l}.weight`, `layers.{l}.bias`), with the
//! architecture's text in the metadata under `architecture`. An external model's file is the
//! user's: its tensors' names and shapes define the model ([`external_layout`]), and the run's
//! `model.safetensors` keeps them, so `safetensors.torch.load_file` gives back a `state_dict`.

use crate::records::file_digest;
use fl_model::{ExternalModel, Model, TensorShape};
use safetensors::{Dtype, SafeTensors, tensor::TensorView};
use std::collections::HashMap;

/// The metadata key of the architecture's text (`784-600-100-10`, `28x28x1 conv:32:5:pad2 ...`).
pub const ARCHITECTURE: &str = "architecture";

/// Serialises `params` of `spec`.
pub fn encode(spec: &Model, params: &[f32]) -> std::io::Result<Vec<u8>> {
    let tensors: Vec<(String, Vec<usize>, Vec<u8>)> = spec
        .named_tensors(params)
        .into_iter()
        .map(|(name, shape, values)| {
            let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            (name, shape, bytes)
        })
        .collect();
    let views = tensors
        .iter()
        .map(|(name, shape, bytes)| {
            TensorView::new(Dtype::F32, shape.clone(), bytes).map(|view| (name.clone(), view))
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(std::io::Error::other)?;
    let mut metadata = HashMap::from([(ARCHITECTURE.to_string(), spec.to_string())]);
    let parts = (tensors.iter())
        .map(|(name, shape, data)| file_digest::Part {
            name,
            dtype: format!("{:?}", Dtype::F32),
            shape,
            data,
        })
        .collect();
    let digest = file_digest::of(parts, &metadata);
    metadata.insert(file_digest::KEY.into(), digest);
    safetensors::tensor::serialize(views, Some(metadata)).map_err(std::io::Error::other)
}

/// Reads a model file, refusing one whose digest does not match (a file of another tool, with
/// no digest, is taken as it is).
fn read(bytes: &[u8]) -> Result<SafeTensors<'_>, String> {
    let (_, header) =
        SafeTensors::read_metadata(bytes).map_err(|e| format!("not safetensors: {e}"))?;
    let file = SafeTensors::deserialize(bytes).map_err(|e| format!("not safetensors: {e}"))?;
    file_digest::check(&file, header.metadata().as_ref())?;
    Ok(file)
}

/// Whether a tensor of `dtype` is an integer or boolean buffer (BatchNorm's
/// `num_batches_tracked`): not a parameter, never averaged; the clients keep their own (as
/// FedBN keeps local statistics).
fn is_buffer(dtype: Dtype) -> bool {
    use Dtype::*;
    matches!(dtype, BOOL | U8 | I8 | U16 | I16 | U32 | I32 | U64 | I64)
}

/// The external model whose tensors `bytes` holds: its float tensors must be F32 (the flat
/// vector is f32); integer and boolean buffers are left out, and named in the returned list.
pub fn external_layout(bytes: &[u8]) -> Result<(ExternalModel, Vec<String>), String> {
    let file = read(bytes)?;
    let (buffers, tensors): (Vec<_>, Vec<_>) =
        (file.tensors().into_iter()).partition(|(_, view)| is_buffer(view.dtype()));
    let buffers = buffers.into_iter().map(|(name, _)| name).collect();
    let tensors = (tensors.into_iter())
        .map(|(name, view)| match view.dtype() {
            Dtype::F32 => Ok(TensorShape {
                name,
                shape: view.shape().to_vec(),
            }),
            other => Err(format!(
                "tensor {name} is {other:?}: an external model's float tensors must be F32 \
                 (convert them with .float())"
            )),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let model = ExternalModel::new(tensors).map_err(|e| e.to_string())?;
    Ok((model, buffers))
}

/// The parameters of `spec` in `bytes`: every tensor the model names must be there, f32, of
/// its shape and finite, and no other tensor may be (a file for another network is refused,
/// whatever its metadata says).
pub fn decode(spec: &Model, bytes: &[u8]) -> Result<Vec<f32>, String> {
    let file = read(bytes)?;
    let zeros = vec![0.0; spec.num_params()];
    let names = spec.named_tensors(&zeros);
    let mut present = file.names();
    present.retain(|n| file.tensor(n).is_ok_and(|v| !is_buffer(v.dtype())));
    present.sort();
    if let Some(extra) = (present.into_iter()).find(|n| !names.iter().any(|(name, ..)| name == *n))
    {
        return Err(format!("tensor {extra} is not part of the network {spec}"));
    }
    let mut params = Vec::with_capacity(spec.num_params());
    for (name, shape, _) in &names {
        let view = file
            .tensor(name)
            .map_err(|_| format!("tensor {name} is missing (the network is {spec})"))?;
        if view.dtype() != Dtype::F32 {
            return Err(format!("tensor {name} is {:?}, not F32", view.dtype()));
        }
        if view.shape() != shape.as_slice() {
            return Err(format!(
                "tensor {name} has shape {:?}, the network's is {shape:?}",
                view.shape()
            ));
        }
        let values = view.data().chunks_exact(4);
        params.extend(values.map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])));
    }
    if let Some(bad) = params.iter().position(|v| !v.is_finite()) {
        return Err(format!("parameter {bad} is not finite"));
    }
    Ok(params)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fl_model::{LayerSpec, ModelSpec, Shape};

    #[test]
    fn a_model_reads_back_and_keeps_its_layout() {
        let spec = Model::from(ModelSpec::mlp(3, &[2], 2).unwrap());
        let params: Vec<f32> = (0..spec.num_params()).map(|i| i as f32).collect();
        let bytes = encode(&spec, &params).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let w1 = st.tensor("layers.1.weight").unwrap();
        assert_eq!(w1.shape(), &[2, 2]);
        let first = f32::from_le_bytes(w1.data()[..4].try_into().unwrap());
        assert_eq!(first, 8.0); // after 3x2 weights and 2 biases
        assert_eq!(decode(&spec, &bytes).unwrap(), params);
        // A flipped byte in the weights is refused; the same file from another tool (no
        // digest) is taken as it is.
        let mut flipped = bytes.clone();
        let at = flipped.len() - 8;
        flipped[at] ^= 1;
        let e = decode(&spec, &flipped).unwrap_err();
        assert!(e.contains("does not match its digest"), "{e}");
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let plain = safetensors::tensor::serialize(st.tensors(), None).unwrap();
        assert_eq!(decode(&spec, &plain).unwrap(), params);
    }

    fn small_cnn(channels: usize) -> Model {
        let input = Shape {
            height: 6,
            width: 6,
            channels: 1,
        };
        let layers: Vec<LayerSpec> = [
            &format!("conv:{channels}:3:pad1"),
            "relu",
            "maxpool:2",
            "dense:3",
        ]
        .iter()
        .map(|t| t.parse().unwrap())
        .collect();
        ModelSpec::sequential(input, &layers).unwrap().into()
    }

    #[test]
    fn a_cnn_names_its_layers_by_position_and_refuses_another_network() {
        let spec = small_cnn(4);
        let params: Vec<f32> = (0..spec.num_params()).map(|i| i as f32 / 10.0).collect();
        let bytes = encode(&spec, &params).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        assert_eq!(st.tensor("layers.0.weight").unwrap().shape(), &[3, 3, 1, 4]);
        assert_eq!(
            st.tensor("layers.3.weight").unwrap().shape(),
            &[3 * 3 * 4, 3]
        );
        assert_eq!(decode(&spec, &bytes).unwrap(), params);

        let e = decode(&small_cnn(5), &bytes).unwrap_err();
        assert!(e.contains("layers.0.weight has shape [3, 3, 1, 4]"), "{e}");
        let mlp = Model::from(ModelSpec::mlp(36, &[4], 3).unwrap());
        let e = decode(&mlp, &bytes).unwrap_err();
        assert!(e.contains("layers.3.bias is not part"), "{e}");
        let e = decode(&spec, &encode(&mlp, &vec![0.0; mlp.num_params()]).unwrap()).unwrap_err();
        assert!(e.contains("layers.1.bias is not part"), "{e}");
        let mut nan = params.clone();
        nan[7] = f32::NAN;
        let e = decode(&spec, &encode(&spec, &nan).unwrap()).unwrap_err();
        assert!(e.contains("parameter 7"), "{e}");
        assert!(decode(&spec, b"not a file").is_err());
    }

    /// A user's file defines an external model by its names and shapes, whatever the order it
    /// was written in; the run's file keeps them; a non-float tensor is refused by name.
    #[test]
    fn an_external_model_is_the_files_tensors_and_is_written_back_under_their_names() {
        let tensor = |name: &str, shape: &[usize]| TensorShape {
            name: name.into(),
            shape: shape.to_vec(),
        };
        let user = Model::External(
            ExternalModel::new(vec![
                tensor("fc.weight", &[3, 2]),
                tensor("conv.bias", &[4]),
            ])
            .unwrap(),
        );
        let params: Vec<f32> = (0..10).map(|i| i as f32).collect();
        let bytes = encode(&user, &params).unwrap();
        let (layout, buffers) = external_layout(&bytes).unwrap();
        assert!(buffers.is_empty());
        assert_eq!(Model::External(layout.clone()), user);
        assert_eq!(layout.tensors()[0].name, "conv.bias");
        assert_eq!(decode(&user, &bytes).unwrap(), params);
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let w = st.tensor("fc.weight").unwrap();
        assert_eq!(w.shape(), &[3, 2]);
        assert_eq!(f32::from_le_bytes(w.data()[..4].try_into().unwrap()), 4.0);

        // An integer buffer (BatchNorm's step count) is left out and named; a float tensor of
        // another width is refused by name.
        let steps = [0u8; 8];
        let int = TensorView::new(Dtype::I64, vec![1], &steps).unwrap();
        let weight = [0u8; 8];
        let w = TensorView::new(Dtype::F32, vec![2], &weight).unwrap();
        let both = [("bn.num_batches_tracked", int.clone()), ("bn.weight", w)];
        let file = safetensors::tensor::serialize(both, None).unwrap();
        let (layout, buffers) = external_layout(&file).unwrap();
        assert_eq!(buffers, ["bn.num_batches_tracked"]);
        assert_eq!(layout.tensors().len(), 1);
        assert_eq!(decode(&Model::External(layout), &file).unwrap(), [0.0, 0.0]);
        let wide = TensorView::new(Dtype::F64, vec![1], &steps).unwrap();
        let file = safetensors::tensor::serialize([("x", wide)], None).unwrap();
        let e = external_layout(&file).unwrap_err();
        assert!(e.contains("tensor x is F64"), "{e}");
        assert!(external_layout(b"junk").is_err());
    }
}
