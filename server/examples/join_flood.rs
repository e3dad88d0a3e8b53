//! A join flood for `scripts/hostile-load.sh`: `JOINS` Join requests with no Session after them,
//! `CONCURRENCY` at a time over one HTTP/2 connection, from one address; prints how many were
//! accepted and refused, by status code, and how long it took.
//!
//! Usage: `cargo run --release -p fl-server --example join_flood -- ENDPOINT JOINS CONCURRENCY`

use fl_proto::v1::JoinRequest;
use fl_proto::v1::federation_client::FederationClient;
use std::collections::BTreeMap;
use std::time::Instant;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, endpoint, joins, concurrency] = args.as_slice() else {
        return Err("usage: join_flood ENDPOINT JOINS CONCURRENCY".into());
    };
    let (joins, concurrency): (usize, usize) = (joins.parse()?, concurrency.parse()?);
    let channel = tonic::transport::Endpoint::from_shared(endpoint.clone())?
        .connect()
        .await?;
    let started = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|t| {
            let mut grpc = FederationClient::new(channel.clone());
            let share = joins / concurrency + usize::from(t < joins % concurrency);
            tokio::spawn(async move {
                let mut codes: BTreeMap<String, usize> = BTreeMap::new();
                for _ in 0..share {
                    let request = JoinRequest {
                        token: String::new(),
                        name: "flood".into(),
                    };
                    let code = match grpc.join(request).await {
                        Ok(_) => "OK".to_string(),
                        Err(status) => format!("{:?}", status.code()),
                    };
                    *codes.entry(code).or_default() += 1;
                }
                codes
            })
        })
        .collect();
    let mut codes: BTreeMap<String, usize> = BTreeMap::new();
    for task in tasks {
        for (code, n) in task.await? {
            *codes.entry(code).or_default() += n;
        }
    }
    println!(
        "{joins} joins in {:.1} s: {codes:?}",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
