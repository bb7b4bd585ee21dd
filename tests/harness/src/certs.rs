//! The control plane's PKI: a CA, the apiserver's serving certificate, the admin client
//! certificate and the service-account signing key pair.

use std::fs;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};

use crate::Error;

/// PEM files written to the control plane's directory.
#[derive(Clone, Debug)]
pub(crate) struct PkiFiles {
    /// CA certificate: trusted for serving and used as `--client-ca-file`.
    pub ca_cert: PathBuf,
    pub serving_cert: PathBuf,
    pub serving_key: PathBuf,
    /// Client certificate for user `admin` in group `system:masters`.
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    /// Service-account token verification key (`--service-account-key-file`).
    pub sa_public_key: PathBuf,
    /// Service-account token signing key (`--service-account-signing-key-file`).
    pub sa_private_key: PathBuf,
}

/// Generates a fresh PKI and writes it as PEM files under `dir`.
pub(crate) fn generate(dir: &Path) -> Result<PkiFiles, Error> {
    fs::create_dir_all(dir).map_err(Error::io(format!("creating {}", dir.display())))?;

    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::default();
    ca_params.distinguished_name = name("banlieue-testenv-ca", None);
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let ca = Issuer::new(ca_params, ca_key);

    let serving_key = KeyPair::generate()?;
    let mut serving = CertificateParams::new(["127.0.0.1".to_owned(), "localhost".to_owned()])?;
    serving.distinguished_name = name("kube-apiserver", None);
    serving.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let serving_cert = serving.signed_by(&serving_key, &ca)?;

    let client_key = KeyPair::generate()?;
    let mut client = CertificateParams::default();
    client.distinguished_name = name("admin", Some("system:masters"));
    client.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let client_cert = client.signed_by(&client_key, &ca)?;

    // ECDSA P-256: the apiserver signs service-account tokens with ES256.
    let sa_key = KeyPair::generate()?;

    let files = PkiFiles {
        ca_cert: dir.join("ca.crt"),
        serving_cert: dir.join("apiserver.crt"),
        serving_key: dir.join("apiserver.key"),
        client_cert: dir.join("admin.crt"),
        client_key: dir.join("admin.key"),
        sa_public_key: dir.join("sa-signer.pub"),
        sa_private_key: dir.join("sa-signer.key"),
    };
    for (path, pem) in [
        (&files.ca_cert, ca_cert.pem()),
        (&files.serving_cert, serving_cert.pem()),
        (&files.serving_key, serving_key.serialize_pem()),
        (&files.client_cert, client_cert.pem()),
        (&files.client_key, client_key.serialize_pem()),
        (&files.sa_public_key, sa_key.public_key_pem()),
        (&files.sa_private_key, sa_key.serialize_pem()),
    ] {
        fs::write(path, pem).map_err(Error::io(format!("writing {}", path.display())))?;
    }
    Ok(files)
}

fn name(common_name: &str, organization: Option<&str>) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    if let Some(org) = organization {
        dn.push(DnType::OrganizationName, org);
    }
    dn
}
