//! Models the server does not know ([`ExternalModel`]): the clients train them with their own
//! code (PyTorch, JAX, ...), and the server only aggregates a flat vector. What the server keeps
//! is the tensors' names and shapes, so that its `model.safetensors` loads back into the user's
//! framework under the same names.
//!
//! The flat vector holds the tensors in the byte order of their names, each row-major: the order
//! in which `safetensors` writes the tensors of one dtype, and the order of the Python package's
//! `flatten`.

use super::{MAX_PARAMS, ModelError};

/// Most tensors an external model may have (ResNet-152's state_dict has about 1,000).
pub const MAX_TENSORS: usize = 16_384;
/// Longest tensor name, in bytes.
pub const MAX_NAME_BYTES: usize = 512;
/// Most dimensions of one tensor.
pub const MAX_DIMS: usize = 8;

/// One named tensor's shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorShape {
    /// The name, e.g. `conv1.weight`.
    pub name: String,
    /// Its dimensions, row-major (an empty shape is a scalar).
    pub shape: Vec<usize>,
}

impl TensorShape {
    /// Values in the tensor, if the product fits.
    fn len(&self) -> Option<usize> {
        self.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d))
    }
}

/// A validated external model: at least one tensor, names unique, non-empty and in byte order,
/// every dimension positive, at most [`MAX_PARAMS`] values in all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExternalModel {
    tensors: Vec<TensorShape>,
}

impl ExternalModel {
    /// The model of these tensors, put in name order; refuses duplicate or empty names, a zero
    /// dimension, and sizes beyond the limits (a peer's list is untrusted).
    pub fn new(mut tensors: Vec<TensorShape>) -> Result<Self, ModelError> {
        let bad = |why: String| Err(ModelError::BadTensors(why));
        if tensors.is_empty() || tensors.len() > MAX_TENSORS {
            return bad(format!("{} tensors (1 to {MAX_TENSORS})", tensors.len()));
        }
        tensors.sort_by(|a, b| a.name.as_bytes().cmp(b.name.as_bytes()));
        if let Some(w) = tensors.windows(2).find(|w| w[0].name == w[1].name) {
            return bad(format!("tensor {:?} is named twice", w[0].name));
        }
        let mut total = 0usize;
        for t in &tensors {
            if t.name.is_empty() || t.name.len() > MAX_NAME_BYTES {
                return bad(format!("a tensor name of {} bytes", t.name.len()));
            }
            if t.shape.len() > MAX_DIMS || t.shape.contains(&0) {
                return bad(format!("tensor {:?} has shape {:?}", t.name, t.shape));
            }
            match t.len().and_then(|n| total.checked_add(n)) {
                Some(n) if n <= MAX_PARAMS => total = n,
                _ => return bad(format!("more than {MAX_PARAMS} parameters")),
            }
        }
        Ok(Self { tensors })
    }

    /// The tensors, in the flat vector's order.
    pub fn tensors(&self) -> &[TensorShape] {
        &self.tensors
    }

    /// Length of the flat parameter vector.
    pub fn num_params(&self) -> usize {
        // Checked in `new`.
        self.tensors.iter().filter_map(TensorShape::len).sum()
    }

    /// The named tensors of `params`, in order, as (name, shape, values).
    pub fn named_tensors<'a>(&self, params: &'a [f32]) -> Vec<(String, Vec<usize>, &'a [f32])> {
        let mut offset = 0;
        (self.tensors.iter())
            .map(|t| {
                let n = t.len().unwrap_or(0);
                let values = &params[offset..offset + n];
                offset += n;
                (t.name.clone(), t.shape.clone(), values)
            })
            .collect()
    }
}

/// `external: 8 tensors, 1663370 parameters`.
impl std::fmt::Display for ExternalModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "external: {} tensors, {} parameters",
            self.tensors.len(),
            self.num_params()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(name: &str, shape: &[usize]) -> TensorShape {
        TensorShape {
            name: name.into(),
            shape: shape.to_vec(),
        }
    }

    #[test]
    fn tensors_are_kept_in_byte_order_of_their_names() {
        // Byte order puts "fc.bias" before "fc.weight" and "Z" before "a".
        let model = ExternalModel::new(vec![
            tensor("fc.weight", &[2, 3]),
            tensor("a", &[]),
            tensor("fc.bias", &[2]),
            tensor("Z", &[1, 1]),
        ])
        .unwrap();
        let names: Vec<&str> = model.tensors().iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["Z", "a", "fc.bias", "fc.weight"]);
        assert_eq!(model.num_params(), 1 + 1 + 2 + 6);
        let params: Vec<f32> = (0..10).map(|i| i as f32).collect();
        let named = model.named_tensors(&params);
        assert_eq!(named[2].2, &[2.0, 3.0]);
        assert_eq!(named[3].1, vec![2, 3]);
        assert_eq!(named[3].2, &params[4..]);
        assert_eq!(model.to_string(), "external: 4 tensors, 10 parameters");
    }

    #[test]
    fn refuses_what_a_peer_could_abuse() {
        let refused = |t: Vec<TensorShape>| ExternalModel::new(t).unwrap_err().to_string();
        assert!(refused(vec![]).contains("0 tensors"));
        assert!(refused(vec![tensor("w", &[2]), tensor("w", &[3])]).contains("named twice"));
        assert!(refused(vec![tensor("", &[2])]).contains("name of 0 bytes"));
        assert!(refused(vec![tensor("w", &[2, 0])]).contains("shape [2, 0]"));
        assert!(refused(vec![tensor("w", &[usize::MAX, 2])]).contains("parameters"));
        assert!(
            refused(vec![tensor("w", &[1 << 14, 1 << 14]), tensor("v", &[1])])
                .contains("parameters")
        );
        assert!(refused(vec![tensor("w", &[1; 9])]).contains("shape"));
    }
}
