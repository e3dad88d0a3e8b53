//! The helper role (`fl-server --role helper`): its key file, and the service it runs until
//! stopped (`crate::edge::helper`).

use crate::config::ServerSection;
use crate::edge::helper::serve_helper;
use crate::edge::transport::{server_builder, signalled};
use crate::error::ServerError;
use fl_common::durable::write_secret;
use fl_secagg::verified::{Helper, HelperKey};
use std::path::Path;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// A helper's floors: the fewest valid uploads it releases a sum of, and the least noise
/// multiplier it adds whatever the leader asks (`N:Z`, e.g. `2:0`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HelperFloors {
    /// N.
    pub min_clients: usize,
    /// Z.
    pub min_noise_multiplier: f64,
}

impl std::str::FromStr for HelperFloors {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("{s:?}: N:Z, the fewest uploads (at least 1) and a noise multiplier");
        let (n, z) = s.split_once(':').ok_or_else(bad)?;
        let min_clients: usize = n.trim().parse().map_err(|_| bad())?;
        let min_noise_multiplier: f64 = z.trim().parse().map_err(|_| bad())?;
        if min_clients == 0 || !(min_noise_multiplier.is_finite() && min_noise_multiplier >= 0.0) {
            return Err(bad());
        }
        Ok(Self {
            min_clients,
            min_noise_multiplier,
        })
    }
}

/// What a helper runs with.
#[derive(Debug)]
pub struct HelperOptions {
    /// Its private key.
    pub key: HelperKey,
    /// The token its leader presents.
    pub leader_token: String,
    /// Its floors.
    pub floors: HelperFloors,
}

impl HelperOptions {
    /// The options with the key of `key_file` (64 hex digits), or a new key written there
    /// (readable by its owner only) when the file does not exist.
    pub fn read(
        key_file: &Path,
        leader_token: String,
        floors: HelperFloors,
    ) -> Result<Self, ServerError> {
        Ok(Self {
            key: helper_key(key_file)?,
            leader_token,
            floors,
        })
    }

    /// The public key clients seal to, in hex.
    pub fn public_hex(&self) -> String {
        hex::encode(self.key.public().to_bytes())
    }
}

/// The helper's key from `path`, or a new one written there.
fn helper_key(path: &Path) -> Result<HelperKey, ServerError> {
    let bad = |m: String| ServerError::Helper(format!("{}: {m}", path.display()));
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let bytes = hex::decode(text.trim()).map_err(|e| bad(e.to_string()))?;
            HelperKey::from_bytes(&bytes).map_err(|e| bad(e.to_string()))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let (key, _) = HelperKey::generate();
            let text = format!("{}\n", hex::encode(key.to_bytes()));
            write_secret(path, text.as_bytes()).map_err(|e| bad(e.to_string()))?;
            Ok(key)
        }
        Err(e) => Err(bad(e.to_string())),
    }
}

/// Serves as the helper on `listener` (TLS as `server` says) until `stop`.
pub(crate) async fn run_helper(
    listener: TcpListener,
    server: &ServerSection,
    options: HelperOptions,
    stop: watch::Receiver<bool>,
) -> Result<(), ServerError> {
    if options.leader_token.is_empty() {
        return Err(ServerError::Helper(
            "a helper needs --leader-token (or FL_LEADER_TOKEN): the token its leader presents"
                .into(),
        ));
    }
    let HelperFloors {
        min_clients,
        min_noise_multiplier,
    } = options.floors;
    let helper = Helper::new(options.key, min_clients, min_noise_multiplier);
    let builder = server_builder(server)?;
    serve_helper(
        builder,
        listener,
        (helper, &options.leader_token),
        signalled(stop),
    )
    .await
}
