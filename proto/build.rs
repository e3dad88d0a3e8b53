//! Compiles `fl.proto` with `protox` (a pure-Rust protobuf compiler), so building needs no
//! system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=fl.proto");
    let descriptors = protox::compile(["fl.proto"], ["."])?;
    // Chunk payloads as `Bytes`: one model encoded per round is shared by every sampled client's
    // stream instead of copied.
    tonic_prost_build::configure()
        .codec_path("crate::codec::StrictCodec")
        .bytes(".flp.v1.TensorChunk.data")
        .compile_fds(descriptors)?;
    Ok(())
}
