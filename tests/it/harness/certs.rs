//! Certificates made at test time with rcgen: a test CA that issues certificates for loopback,
//! and self-signed certificates to pin. Nothing is read from or written to the system's trust
//! store.

use std::path::{Path, PathBuf};

use emisar::util::tls::Fingerprint;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// A certificate and its key, as PEM files.
#[derive(Clone, Debug)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub fingerprint: Fingerprint,
}

/// A CA that exists for one test.
pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
    /// The CA certificate (PEM), for clients to trust.
    pub file: PathBuf,
}

impl TestCa {
    pub fn new(dir: &Path, name: &str) -> TestCa {
        let mut params = CertificateParams::default();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params
            .distinguished_name
            .push(DnType::CommonName, format!("{name} test CA"));
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let file = dir.join(format!("{name}-ca.crt"));
        std::fs::write(&file, issuer.pem()).unwrap();
        TestCa { issuer, file }
    }

    /// A server certificate for `names` (DNS names or IP addresses), signed by this CA.
    pub fn issue(&self, dir: &Path, file_stem: &str, names: &[&str]) -> CertFiles {
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params
            .distinguished_name
            .push(DnType::CommonName, file_stem.to_owned());
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        write(
            dir,
            file_stem,
            &cert.pem(),
            &key.serialize_pem(),
            cert.der(),
        )
    }
}

/// A self-signed certificate for loopback, as a runner makes for itself.
pub fn self_signed(dir: &Path, file_stem: &str) -> CertFiles {
    let made =
        rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
    write(
        dir,
        file_stem,
        &made.cert.pem(),
        &made.signing_key.serialize_pem(),
        made.cert.der(),
    )
}

fn write(dir: &Path, stem: &str, cert_pem: &str, key_pem: &str, der: &[u8]) -> CertFiles {
    let cert = dir.join(format!("{stem}.crt"));
    let key = dir.join(format!("{stem}.key"));
    std::fs::write(&cert, cert_pem).unwrap();
    std::fs::write(&key, key_pem).unwrap();
    CertFiles {
        cert,
        key,
        fingerprint: Fingerprint::of(der),
    }
}
