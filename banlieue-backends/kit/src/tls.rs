//! The rustls configuration: ring as the crypto provider (never aws-lc), the
//! Provider's CA bundle or the system's roots, or no verification when asked.

use std::sync::Arc;

use banlieue_sdk::backend::{BackendError, Connection};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

/// Builds the client TLS configuration for a connection.
pub fn client_config(connection: &Connection) -> Result<ClientConfig, BackendError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| BackendError::terminal("InvalidTLSConfig", e.to_string()))?;
    if connection.insecure_skip_tls_verify {
        return Ok(builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerification(
                provider.signature_verification_algorithms,
            )))
            .with_no_client_auth());
    }
    let mut roots = RootCertStore::empty();
    match &connection.ca_bundle {
        Some(pem) => {
            for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
                let cert = cert.map_err(|e| {
                    BackendError::terminal("InvalidCABundle", format!("caBundle is not PEM: {e}"))
                })?;
                roots.add(cert).map_err(|e| {
                    BackendError::terminal(
                        "InvalidCABundle",
                        format!("caBundle holds an unusable certificate: {e}"),
                    )
                })?;
            }
            if roots.is_empty() {
                return Err(BackendError::terminal(
                    "InvalidCABundle",
                    "caBundle holds no PEM certificate",
                ));
            }
        }
        None => {
            let native = rustls_native_certs::load_native_certs();
            for cert in native.certs {
                let _ = roots.add(cert);
            }
        }
    }
    Ok(builder.with_root_certificates(roots).with_no_client_auth())
}

/// `insecureSkipTLSVerify`: accepts any certificate, still checks handshake signatures.
#[derive(Debug)]
struct NoVerification(WebPkiSupportedAlgorithms);

impl ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_schemes()
    }
}
