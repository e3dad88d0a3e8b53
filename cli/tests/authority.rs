//! `fl authority` end to end: an authority's key pair, a client's identity key, a certificate that
//! verifies under that authority only, revocation, and keys that are never replaced.

use fl_authority::AuthorityError;
use fl_authority::files::{FileError, FormatError};
use fl_authority::policy::PolicyError;
use std::path::Path;
use std::process::{Command, Output};

fn fl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fl"))
        .arg("authority")
        .args(args)
        .output()
        .unwrap()
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn a_certificate_verifies_under_its_authority_until_revoked() {
    let dir = std::env::temp_dir().join(format!("fl-authority-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (authority, other, client) = (dir.join("authority"), dir.join("other"), dir.join("client"));
    for (what, d) in [
        ("init", &authority),
        ("init", &other),
        ("identity", &client),
    ] {
        let made = fl(&[what, "--dir", path(d)]);
        assert!(made.status.success(), "{made:?}");
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(authority.join("authority.key"))
            .unwrap()
            .permissions();
        assert_eq!(mode.mode() & 0o777, 0o600);
    }
    let again = fl(&["init", "--dir", path(&authority)]);
    assert!(!again.status.success(), "a key was replaced");
    let cert = dir.join("hospital-1.cert");
    let signed = fl(&[
        "sign",
        "--key",
        path(&authority.join("authority.key")),
        "--name",
        "hospital-1",
        "--identity",
        path(&client.join("identity.pub")),
        "--out",
        path(&cert),
    ]);
    assert!(signed.status.success(), "{signed:?}");
    let verify = |by: &Path, revocations: Option<&Path>| {
        let mut args = vec!["verify", "--authority", path(by), "--cert", path(&cert)];
        if let Some(list) = revocations {
            args.extend(["--revocations", path(list)]);
        }
        fl(&args)
    };
    assert!(
        verify(&authority.join("authority.pub"), None)
            .status
            .success()
    );
    let elsewhere = verify(&other.join("authority.pub"), None);
    assert!(!elsewhere.status.success());
    assert!(String::from_utf8_lossy(&elsewhere.stderr).contains("does not verify"));
    let list = dir.join("revoked.toml");
    let key = authority.join("authority.key");
    for name in ["hospital-9", "hospital-1"] {
        let revoked = fl(&[
            "revoke",
            "--key",
            path(&key),
            "--name",
            name,
            "--list",
            path(&list),
        ]);
        assert!(revoked.status.success(), "{revoked:?}");
    }
    assert!(
        std::fs::read_to_string(&list)
            .unwrap()
            .contains("serial = 2")
    );
    let refused = verify(&authority.join("authority.pub"), Some(&list));
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("hospital-1 is revoked"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `fl authority policy` signs a policy that verifies under its authority only, says how many
/// compromised clients it tolerates, and refuses one that protects nobody.
#[test]
fn a_policy_is_signed_by_its_authority() {
    let dir = std::env::temp_dir().join(format!("fl-authority-policy-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (authority, other) = (dir.join("authority"), dir.join("other"));
    for d in [&authority, &other] {
        assert!(fl(&["init", "--dir", path(d)]).status.success());
    }
    let out = dir.join("policy.toml");
    let key = authority.join("authority.key");
    let policy = |threshold: &str, z: &str| {
        fl(&[
            "policy",
            "--key",
            path(&key),
            "--federation",
            "hospitals",
            "--serial",
            "1",
            "--allow",
            "secagg,ldp-gaussian",
            "--min-clients",
            "100",
            "--min-degree",
            "24",
            "--min-threshold",
            threshold,
            "--min-noise-multiplier",
            z,
            "--max-release-epsilon",
            "4",
            "--max-total-epsilon",
            "50",
            "--out",
            path(&out),
        ])
    };
    let noise_free = policy("0.7", "0");
    let said = String::from_utf8_lossy(&noise_free.stdout);
    assert!(said.contains("secure rounds are not charged"), "{said}");
    let costly = policy("0.7", "1");
    let said = String::from_utf8_lossy(&costly.stderr);
    assert!(!costly.status.success());
    assert!(
        said.contains("clients would refuse every secure round"),
        "{said}"
    );
    let signed = policy("0.7", "4");
    assert!(signed.status.success(), "{signed:?}");
    let said = String::from_utf8_lossy(&signed.stdout);
    assert!(said.contains("up to 9 compromised clients"), "{said}");
    assert!(
        said.contains("costs each client at least epsilon 2.17"),
        "{said}"
    );
    let read = |by: &Path| {
        fl_authority::policy::SignedPolicy::read_verified(&out, &by.join("authority.pub"))
    };
    assert_eq!(read(&authority).unwrap().min_clients, 100);
    let refused = read(&other).unwrap_err();
    assert!(
        matches!(
            refused,
            FileError::Invalid {
                problem: FormatError::Policy(PolicyError::Signature(AuthorityError::Signature(_))),
                ..
            }
        ),
        "{refused}"
    );
    let weak = policy("0.6", "4");
    assert!(!weak.status.success());
    assert!(String::from_utf8_lossy(&weak.stderr).contains("above 2/3"));
    std::fs::remove_dir_all(&dir).unwrap();
}
