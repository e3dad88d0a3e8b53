//! Compiles `fl.proto` with `protox` (a pure-Rust protobuf compiler), so building needs no
//! system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=fl.proto");
    let descriptors = protox::compile(["fl.proto"], ["."])?;
    // Chunk payloads as `Bytes`: a decoded chunk is a slice of the received message, not a copy.
    tonic_prost_build::configure()
        .codec_path("crate::codec::StrictCodec")
        // `Session` is served below the codec (`fl_server::session`); its generated handler is
        // the default stub, never routed to.
        .generate_default_stubs(true)
        .bytes(".flp.v1.TensorChunk.data")
        .compile_fds(descriptors)?;
    Ok(())
}
