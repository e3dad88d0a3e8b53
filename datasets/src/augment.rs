//! Random translations of training images (Simard, Steinkraus, Platt 2003, "Best Practices for
//! Convolutional Neural Networks Applied to Visual Document Analysis", Sec. 2: distorted copies
//! of MNIST's digits), drawn afresh for every example of every local batch. It is a client's own
//! computation on its own examples: the server sees the protected update as without it, so it
//! costs no privacy.

use crate::Shape;
use rand::Rng;

/// Translates every image of `x` (row-major, one example of `shape`, HWC, per row) by its own
/// offsets (dy, dx), each drawn uniformly from {-s, ..., s}: `out[r][c] = in[r - dy][c - dx]`,
/// zero where that falls outside the image. An axis of size 1 is not moved (a flat vector is left
/// as it is). `scratch` is reused from call to call.
pub fn shift_images(
    x: &mut [f32],
    shape: Shape,
    s: u32,
    rng: &mut impl Rng,
    scratch: &mut Vec<f32>,
) {
    let s = i64::from(s);
    let mut offset = |size: usize| match size {
        1 => 0,
        _ => rng.random_range(-s..=s) as isize,
    };
    for image in x.chunks_exact_mut(shape.len().max(1)) {
        let (dy, dx) = (offset(shape.height), offset(shape.width));
        translate(image, shape, dy, dx, scratch);
    }
}

/// Moves `image` by `dy` rows and `dx` columns (zeros shifted in).
fn translate(image: &mut [f32], shape: Shape, dy: isize, dx: isize, scratch: &mut Vec<f32>) {
    let (h, w, ch) = (shape.height as isize, shape.width as isize, shape.channels);
    scratch.clear();
    scratch.resize(image.len(), 0.0);
    // Columns c of the output with 0 <= c - dx < w: one contiguous run per row.
    let (c0, c1) = (dx.clamp(0, w), (w + dx).clamp(0, w));
    for r in 0..h {
        let source = r - dy;
        if !(0..h).contains(&source) || c0 >= c1 {
            continue;
        }
        let out = ((r * w + c0) as usize * ch)..((r * w + c1) as usize * ch);
        let from = ((source * w + c0 - dx) as usize * ch)..((source * w + c1 - dx) as usize * ch);
        scratch[out].copy_from_slice(&image[from]);
    }
    image.copy_from_slice(scratch);
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    /// A 3 x 4 image with two channels, value 100 r + 10 c + k at (r, c, k).
    fn image() -> (Vec<f32>, Shape) {
        let shape = Shape {
            height: 3,
            width: 4,
            channels: 2,
        };
        let x = (0..3)
            .flat_map(|r| {
                (0..4).flat_map(move |c| (0..2).map(move |k| (100 * r + 10 * c + k) as f32))
            })
            .collect();
        (x, shape)
    }

    /// Every (dy, dx) within the image moves each value by exactly that and fills the rest with
    /// zeros, against the definition out[r][c] = in[r - dy][c - dx].
    #[test]
    fn translation_matches_its_definition() {
        let (x, shape) = image();
        let mut scratch = Vec::new();
        for dy in -4..=4isize {
            for dx in -5..=5isize {
                let mut moved = x.clone();
                translate(&mut moved, shape, dy, dx, &mut scratch);
                for r in 0..3isize {
                    for c in 0..4isize {
                        for k in 0..2isize {
                            let (sr, sc) = (r - dy, c - dx);
                            let expected = if (0..3).contains(&sr) && (0..4).contains(&sc) {
                                (100 * sr + 10 * sc + k) as f32
                            } else {
                                0.0
                            };
                            let at = ((r * 4 + c) * 2 + k) as usize;
                            assert_eq!(moved[at], expected, "dy {dy} dx {dx} at ({r}, {c}, {k})");
                        }
                    }
                }
            }
        }
    }

    /// Offsets stay within s, every one of the 2s + 1 values occurs on each axis, and each
    /// image of a batch gets its own: with s = 1 over 600 images each value is expected 200
    /// times per axis (binomial sd 11.5), so none falls below 100 unless the draw is broken.
    #[test]
    fn each_image_gets_its_own_offsets_within_s() {
        let shape = Shape {
            height: 5,
            width: 5,
            channels: 1,
        };
        // A single 1 at the centre: where it lands gives the offsets.
        let mut x = vec![0.0f32; 600 * 25];
        x.chunks_exact_mut(25).for_each(|img| img[12] = 1.0);
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        shift_images(&mut x, shape, 1, &mut rng, &mut Vec::new());
        let mut counts = [[0usize; 3]; 2];
        for img in x.chunks_exact(25) {
            let at = img
                .iter()
                .position(|&v| v == 1.0)
                .expect("the centre stays inside");
            let (dy, dx) = ((at / 5) as isize - 2, (at % 5) as isize - 2);
            assert!(dy.abs() <= 1 && dx.abs() <= 1, "offset ({dy}, {dx})");
            counts[0][(dy + 1) as usize] += 1;
            counts[1][(dx + 1) as usize] += 1;
        }
        assert!(counts.iter().flatten().all(|&n| n >= 100), "{counts:?}");
    }

    /// s = 0 and flat vectors leave the examples unchanged.
    #[test]
    fn no_shift_and_flat_vectors_are_unchanged() {
        let (x, shape) = image();
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut same = x.clone();
        shift_images(&mut same, shape, 0, &mut rng, &mut Vec::new());
        assert_eq!(same, x);
        let mut flat = x.clone();
        shift_images(&mut flat, Shape::flat(24), 3, &mut rng, &mut Vec::new());
        assert_eq!(flat, x);
    }
}
