//! The shape of one example: what a dataset holds and a model's first layer takes.

/// The shape of one example's activations, stored height-major, channels last (HWC).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Shape {
    /// Rows.
    pub height: usize,
    /// Columns.
    pub width: usize,
    /// Values per position.
    pub channels: usize,
}

impl Shape {
    /// A flat vector of `n` values.
    pub fn flat(n: usize) -> Self {
        Self {
            height: 1,
            width: 1,
            channels: n,
        }
    }

    /// Values per example.
    pub fn len(&self) -> usize {
        self.height * self.width * self.channels
    }

    /// Whether an example has no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
