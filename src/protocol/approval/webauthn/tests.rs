//! Tests of `webauthn`: the W3C WebAuthn Level 3 published test vectors (§16), and one
//! refusal per check, each made from a vector or from a software authenticator by changing
//! exactly what that check looks at.

use super::*;
use aws_lc_rs::signature::{ECDSA_P256_SHA256_ASN1_SIGNING, EcdsaKeyPair, KeyPair};

/// One registration and one authentication with the same credential, as §16 prints them
/// (hex). Every vector uses RP ID `example.org` and origin `https://example.org`.
pub struct Vector {
    reg_challenge: &'static str,
    credential_id: &'static str,
    reg_client_data: &'static str,
    attestation_object: &'static str,
    auth_challenge: &'static str,
    authenticator_data: &'static str,
    auth_client_data: &'static str,
    signature: &'static str,
}

mod vectors {
    use super::Vector;

    /// W3C WebAuthn Level 3, §16 Test Vectors, `#sctn-test-vectors-none-es256`.
    pub const NONE_ES256: Vector = Vector {
        reg_challenge: "00c30fb78531c464d2b6771dab8d7b603c01162f2fa486bea70f283ae556e130",
        credential_id: "f91f391db4c9b2fde0ea70189cba3fb63f579ba6122b33ad94ff3ec330084be4",
        reg_client_data: "7b2274797065223a22776562617574686e2e637265617465222c226368616c6c656e6765223a22414d4d507434557878475453746e63647134313759447742466938767049612d7077386f4f755657345441222c226f726967696e223a2268747470733a2f2f6578616d706c652e6f7267222c2263726f73734f726967696e223a66616c73652c22657874726144617461223a22636c69656e74446174614a534f4e206d617920626520657874656e6465642077697468206164646974696f6e616c206669656c647320696e20746865206675747572652c207375636820617320746869733a20426b5165446a646354427258426941774a544c453551227d",
        attestation_object: "a363666d74646e6f6e656761747453746d74a068617574684461746158a4bfabc37432958b063360d3ad6461c9c4735ae7f8edd46592a5e0f01452b2e4b559000000008446ccb9ab1db374750b2367ff6f3a1f0020f91f391db4c9b2fde0ea70189cba3fb63f579ba6122b33ad94ff3ec330084be4a5010203262001215820afefa16f97ca9b2d23eb86ccb64098d20db90856062eb249c33a9b672f26df61225820930a56b87a2fca66334b03458abf879717c12cc68ed73290af2e2664796b9220",
        auth_challenge: "39c0e7521417ba54d43e8dc95174f423dee9bf3cd804ff6d65c857c9abf4d408",
        authenticator_data: "bfabc37432958b063360d3ad6461c9c4735ae7f8edd46592a5e0f01452b2e4b51900000000",
        auth_client_data: "7b2274797065223a22776562617574686e2e676574222c226368616c6c656e6765223a224f63446e55685158756c5455506f334a5558543049393770767a7a59425039745a63685879617630314167222c226f726967696e223a2268747470733a2f2f6578616d706c652e6f7267222c2263726f73734f726967696e223a66616c73657d",
        signature: "3046022100f50a4e2e4409249c4a853ba361282f09841df4dd4547a13a87780218deffcd380221008480ac0f0b93538174f575bf11a1dd5d78c6e486013f937295ea13653e331e87",
    };

    /// W3C WebAuthn Level 3, §16 Test Vectors, `#sctn-test-vectors-packed-es256`.
    pub const PACKED_ES256: Vector = Vector {
        reg_challenge: "c1184a5fddf8045e13dc47f54b61f5a656b666b59018f16d870e9256e9952012",
        credential_id: "c9a6f5b3462d02873fea0c56862234f99f081728084e511bb7760201a89054a5",
        reg_client_data: "7b2274797065223a22776562617574686e2e637265617465222c226368616c6c656e6765223a227752684b58393334424634543345663153324831706c61325a725751475046746877365356756d56494249222c226f726967696e223a2268747470733a2f2f6578616d706c652e6f7267222c2263726f73734f726967696e223a66616c73652c22657874726144617461223a22636c69656e74446174614a534f4e206d617920626520657874656e6465642077697468206164646974696f6e616c206669656c647320696e20746865206675747572652c207375636820617320746869733a20396138624e596a4b436757724258552d66436c316167227d",
        attestation_object: "a363666d74667061636b65646761747453746d74a363616c6726637369675847304502203f19ec4b229f46ab8c45eff29b904ff10c0390dc40bf1216f04a78f4ceba3425022100fe7041a32759aff05a0f9f26c70a999c7a284451ba89234a1d3483c25e21925b637835638159022530820221308201c8a00302010202110088c220f83c8ef1feafe94deae45faad0300a06082a8648ce3d0403023062311e301c06035504030c15576562417574686e207465737420766563746f7273310c300a060355040a0c0357334331253023060355040b0c1c41757468656e74696361746f72204174746573746174696f6e204341310b30090603550406130241413020170d3234303130313030303030305a180f33303234303130313030303030305a305f311e301c06035504030c15576562417574686e207465737420766563746f7273310c300a060355040a0c0357334331223020060355040b0c1941757468656e74696361746f72204174746573746174696f6e310b30090603550406130241413059301306072a8648ce3d020106082a8648ce3d03010703420004a91ba4389409dd38a428141940ca8feb1ac0d7b4350558104a3777a49322f3798440f378b3398ab2d3bb7bf91322c92eb23556f59ad0a836fec4c7663b0e4dc3a360305e300c0603551d130101ff04023000300e0603551d0f0101ff040403020780301d0603551d0e04160414a589ba72d060842ab11f74fb246bdedab16f9b9b301f0603551d2304183016801445aff715b0dd786741fee996ebc16547a3931b1e300a06082a8648ce3d040302034700304402201726b9d85ecd8a5ed51163722ca3a20886fd9b242a0aa0453d442116075defd502207ef471e530ac87961a88a7f0d0c17b091ffc6b9238d30f79f635b417be5910e768617574684461746158a4bfabc37432958b063360d3ad6461c9c4735ae7f8edd46592a5e0f01452b2e4b54d00000000876ca4f52071c3e9b25509ef2cdf7ed60020c9a6f5b3462d02873fea0c56862234f99f081728084e511bb7760201a89054a5a50102032620012158201cf27f25da591208a4239c2e324f104f585525479a29edeedd830f48e77aeae522582059e4b7da6c0106e206ce390c93ab98a15a5ec3887e57f0cc2bece803b920c423",
        auth_challenge: "b1106fa46a57bef1781511c0557dc898a03413d5f0f17d244630c194c7e1adb5",
        authenticator_data: "bfabc37432958b063360d3ad6461c9c4735ae7f8edd46592a5e0f01452b2e4b50d00000000",
        auth_client_data: "7b2274797065223a22776562617574686e2e676574222c226368616c6c656e6765223a2273524276704770587676463446524841565833496d4b4130453958773858306b526a44426c4d6668726255222c226f726967696e223a2268747470733a2f2f6578616d706c652e6f7267222c2263726f73734f726967696e223a66616c73652c22657874726144617461223a22636c69656e74446174614a534f4e206d617920626520657874656e6465642077697468206164646974696f6e616c206669656c647320696e20746865206675747572652c207375636820617320746869733a20415a4d77794d78496244382d756775464e7036723851227d",
        signature: "30450220694969d3ee928de6f02ef23a9c644d7d779916451734a94b432542f498a1ebe90221008b0819c824218a97152cd099c55bfb1477b29d900a49a64018314f9bfccda163",
    };

    /// W3C WebAuthn Level 3, §16 Test Vectors, `#sctn-test-vectors-none-es256-crossOrigin`.
    pub const CROSS_ORIGIN_ES256: Vector = Vector {
        reg_challenge: "3be5aacd03537142472340ab5969f240f1d87716e20b6807ac230655fa4b3b49",
        credential_id: "6e1050c0d2ca2f07c755cb2c66a74c64fa43065c18f938354d9915db2bd5ce57",
        reg_client_data: "7b2274797065223a22776562617574686e2e637265617465222c226368616c6c656e6765223a224f2d57717a514e5463554a484930437257576e7951504859647862694332674872434d475666704c4f306b222c226f726967696e223a2268747470733a2f2f6578616d706c652e6f7267222c2263726f73734f726967696e223a747275652c22657874726144617461223a22636c69656e74446174614a534f4e206d617920626520657874656e6465642077697468206164646974696f6e616c206669656c647320696e20746865206675747572652c207375636820617320746869733a207a5a7175457444523944577170573574425754467567227d",
        attestation_object: "a363666d74646e6f6e656761747453746d74a068617574684461746158a4bfabc37432958b063360d3ad6461c9c4735ae7f8edd46592a5e0f01452b2e4b54500000000883f4f6014f19c09d87aa38123be48d000206e1050c0d2ca2f07c755cb2c66a74c64fa43065c18f938354d9915db2bd5ce57a501020326200121582022200a473f90b11078851550d03b4e44a2279f8c4eca27b3153dedfe03e4e97d225820cbd0be95e746ad6f5a8191be11756e4c0420e72f65b466d39bc56b8b123a9c6e",
        auth_challenge: "876aa517ba83fdee65fcffdbca4c84eeae5d54f8041a1fc85c991e5bbb273137",
        authenticator_data: "bfabc37432958b063360d3ad6461c9c4735ae7f8edd46592a5e0f01452b2e4b50500000000",
        auth_client_data: "7b2274797065223a22776562617574686e2e676574222c226368616c6c656e6765223a226832716c463771445f65356c5f505f62796b7945377135645650674547685f49584a6b655737736e4d5463222c226f726967696e223a2268747470733a2f2f6578616d706c652e6f7267222c2263726f73734f726967696e223a747275652c22657874726144617461223a22636c69656e74446174614a534f4e206d617920626520657874656e6465642077697468206164646974696f6e616c206669656c647320696e20746865206675747572652c207375636820617320746869733a2039327063545644304162792d713464746d6a36656667227d",
        signature: "3046022100eb12fcf23b12764c0f122e22371fab92e283879fd798f38ee1841c951b6e40e7022100c76237ff9db77b3c56f30837cda6a09acfa2e915544e609c0733b1184036d1cf",
    };

    /// W3C WebAuthn Level 3, §16 Test Vectors, `#sctn-test-vectors-packed-eddsa`.
    pub const PACKED_EDDSA: Vector = Vector {
        reg_challenge: "a8abf9dabdc6b0df63466b39bda9e8a34a34e185337a59f1c579990676d3b3bd",
        credential_id: "ce9f840ed96599580cd140fbc7bb3230633f50f61041aff73308ae71caa8a2bd",
        reg_client_data: "7b2274797065223a22776562617574686e2e637265617465222c226368616c6c656e6765223a22714b763532723347734e396a526d733576616e6f6f306f303459557a656c6e7878586d5a426e6254733730222c226f726967696e223a2268747470733a2f2f6578616d706c652e6f7267222c2263726f73734f726967696e223a66616c73652c22657874726144617461223a22636c69656e74446174614a534f4e206d617920626520657874656e6465642077697468206164646974696f6e616c206669656c647320696e20746865206675747572652c207375636820617320746869733a20425f44543567375a445f2d394f544c59583549764551227d",
        attestation_object: "a363666d74667061636b65646761747453746d74a363616c67266373696758483046022100d83f60bd80269537583218858aefb03ac57d45fa06e42feaae332d187f62da9f022100a02bd3cb6f7e1d283c93bad1f3f4b5a4c0494463da7fdbf256949116754d1f17637835638159022730820223308201c8a003020102021100b2cfc9ea33c8643b0e1a760463eaf164300a06082a8648ce3d0403023062311e301c06035504030c15576562417574686e207465737420766563746f7273310c300a060355040a0c0357334331253023060355040b0c1c41757468656e74696361746f72204174746573746174696f6e204341310b30090603550406130241413020170d3234303130313030303030305a180f33303234303130313030303030305a305f311e301c06035504030c15576562417574686e207465737420766563746f7273310c300a060355040a0c0357334331223020060355040b0c1941757468656e74696361746f72204174746573746174696f6e310b30090603550406130241413059301306072a8648ce3d020106082a8648ce3d03010703420004dd2b7a564b73b8c0b81c4c62e521925c4d1198ec9f583dbf1eebe364b65cd9c29a9bdf346aaa81fb6b9507e5249a52fdaf8e39e26b0b7dc45992a7e233b70f70a360305e300c0603551d130101ff04023000300e0603551d0f0101ff040403020780301d0603551d0e041604140ae27546bc7eccb1b4b597bd354f0c0b1f1f8f8e301f0603551d2304183016801445aff715b0dd786741fee996ebc16547a3931b1e300a06082a8648ce3d0403020349003046022100a0d434ecb5fc3bfd7da5f41904517ad2836249f561bd834ba7a438a8ab7a4ce8022100fac845bb7a02513b58e9f319654dbe49b0f02b95835bac568c71f8a18cdde9ab6861757468446174615881bfabc37432958b063360d3ad6461c9c4735ae7f8edd46592a5e0f01452b2e4b54100000000d5aa33581e8ca478e20fe713f5d32ff20020ce9f840ed96599580cd140fbc7bb3230633f50f61041aff73308ae71caa8a2bda401010327200621582044e06ddd331c36a8dc667bab52bcae63486c916aa5e339e6acebaa84934bf832",
        auth_challenge: "895957e01c633a698348a2d8a31a54b7db27e8c1c43b2080d79ae2190267bfd2",
        authenticator_data: "bfabc37432958b063360d3ad6461c9c4735ae7f8edd46592a5e0f01452b2e4b50100000000",
        auth_client_data: "7b2274797065223a22776562617574686e2e676574222c226368616c6c656e6765223a2269566c583442786a4f6d6d44534b4c596f7870557439736e364d48454f7943413135726947514a6e763949222c226f726967696e223a2268747470733a2f2f6578616d706c652e6f7267222c2263726f73734f726967696e223a66616c73657d",
        signature: "f5c59c7e46c34f6f8cc197101ddf9934fa2595f68eb1913a637e8419eb9ba4cfdfc48f85393bc0d40b011f0d6fecb097d6607525713223a0dc0d453993dae00b",
    };
}

fn h(s: &str) -> Vec<u8> {
    hex::decode(s).unwrap()
}

fn example_org() -> RelyingParty {
    RelyingParty {
        rp_id: "example.org".into(),
        origins: vec!["https://example.org".into()],
    }
}

fn register(v: &Vector, uv: Uv) -> Result<PasskeyPublic, WebauthnError> {
    read_registration(
        &example_org(),
        &h(v.reg_challenge),
        &h(v.attestation_object),
        &h(v.reg_client_data),
        uv,
    )
}

fn assertion(v: &Vector) -> Assertion {
    Assertion {
        credential_id: h(v.credential_id),
        authenticator_data: h(v.authenticator_data),
        client_data_json: h(v.auth_client_data),
        signature: h(v.signature),
    }
}

#[test]
fn packed_es256_vector_registers_and_verifies_with_uv_required() {
    let v = &vectors::PACKED_ES256;
    // The packed attestation statement is not trusted; only the credential is read.
    let key = parse_registration(
        &example_org(),
        &h(v.reg_challenge),
        &h(v.attestation_object),
        &h(v.reg_client_data),
    )
    .unwrap();
    assert_eq!(key.alg, CoseAlg::ES256);
    assert_eq!(key.credential_id, h(v.credential_id));
    // SPKI DER of a P-256 key: the fixed 26-byte header, then the uncompressed point.
    assert_eq!(key.public_key.len(), 91);
    assert_eq!(
        hex::encode(&key.public_key[..26]),
        "3059301306072a8648ce3d020106082a8648ce3d030107034200"
    );
    verify_assertion(&example_org(), &key, &h(v.auth_challenge), &assertion(v)).unwrap();
}

#[test]
fn none_es256_vector_is_read_and_verified_but_refused_without_uv() {
    let v = &vectors::NONE_ES256;
    // This vector's authenticator did not verify the user (flags 0x59, then 0x19): every
    // other check passes, and the public functions refuse it for UV alone.
    let key = register(v, Uv::NotRequired).unwrap();
    assert_eq!(key.alg, CoseAlg::ES256);
    assert_eq!(key.credential_id, h(v.credential_id));
    check_assertion(
        &example_org(),
        &key,
        &h(v.auth_challenge),
        &assertion(v),
        Uv::NotRequired,
    )
    .unwrap();
    assert_eq!(
        register(v, Uv::Required).unwrap_err(),
        WebauthnError::UserVerified
    );
    assert_eq!(
        verify_assertion(&example_org(), &key, &h(v.auth_challenge), &assertion(v)).unwrap_err(),
        WebauthnError::UserVerified
    );
}

#[test]
fn packed_eddsa_vector_is_read_and_verified_but_refused_without_uv() {
    let v = &vectors::PACKED_EDDSA;
    let key = register(v, Uv::NotRequired).unwrap();
    assert_eq!(key.alg, CoseAlg::EdDSA);
    // SPKI DER of an Ed25519 key (RFC 8410): 12-byte header, then the 32-byte key.
    assert_eq!(
        hex::encode(&key.public_key[..12]),
        "302a300506032b6570032100"
    );
    assert_eq!(key.public_key.len(), 44);
    check_assertion(
        &example_org(),
        &key,
        &h(v.auth_challenge),
        &assertion(v),
        Uv::NotRequired,
    )
    .unwrap();
    assert_eq!(
        verify_assertion(&example_org(), &key, &h(v.auth_challenge), &assertion(v)).unwrap_err(),
        WebauthnError::UserVerified
    );
    // A flipped signature bit is refused by the EdDSA check.
    let mut a = assertion(v);
    a.signature[10] ^= 1;
    assert_eq!(
        check_assertion(
            &example_org(),
            &key,
            &h(v.auth_challenge),
            &a,
            Uv::NotRequired
        )
        .unwrap_err(),
        WebauthnError::Signature {
            alg: CoseAlg::EdDSA
        }
    );
}

#[test]
fn cross_origin_vector_is_refused_in_both_ceremonies() {
    let v = &vectors::CROSS_ORIGIN_ES256;
    assert_eq!(
        register(v, Uv::Required).unwrap_err(),
        WebauthnError::CrossOrigin
    );
    // The same credential, read from the same authenticator data, with crossOrigin left
    // to the client data: the assertion (UP and UV set, signature valid) is refused too.
    let key = PasskeyPublic {
        credential_id: h(v.credential_id),
        alg: CoseAlg::ES256,
        public_key: cose_to_spki(&h(v.attestation_object)[h(v.attestation_object).len() - 77..])
            .unwrap()
            .1,
    };
    assert_eq!(
        verify_assertion(&example_org(), &key, &h(v.auth_challenge), &assertion(v)).unwrap_err(),
        WebauthnError::CrossOrigin
    );
}

/// A software authenticator with a P-256 key, for refusals no vector shows: it signs
/// whatever authenticator data and client data the test gives it.
struct Soft {
    key: EcdsaKeyPair,
    credential_id: Vec<u8>,
}

impl Soft {
    fn new() -> Self {
        let rng = aws_lc_rs::rand::SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng).unwrap();
        let key =
            EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8.as_ref()).unwrap();
        Soft {
            key,
            credential_id: vec![7; 16],
        }
    }

    fn cose(&self) -> Vec<u8> {
        let point = self.key.public_key().as_ref();
        let map = Value::Map(vec![
            (Value::from(1), Value::from(2)),
            (Value::from(3), Value::from(-7)),
            (Value::from(-1), Value::from(1)),
            (Value::from(-2), Value::Bytes(point[1..33].to_vec())),
            (Value::from(-3), Value::Bytes(point[33..65].to_vec())),
        ]);
        let mut out = Vec::new();
        ciborium::into_writer(&map, &mut out).unwrap();
        out
    }

    fn auth_data(&self, rp_id: &str, flags: u8, attested: bool) -> Vec<u8> {
        let mut d = Sha256::digest(rp_id.as_bytes()).to_vec();
        d.push(flags);
        d.extend_from_slice(&1u32.to_be_bytes());
        if attested {
            d.extend_from_slice(&[0; 16]);
            d.extend_from_slice(&(self.credential_id.len() as u16).to_be_bytes());
            d.extend_from_slice(&self.credential_id);
            d.extend_from_slice(&self.cose());
        }
        d
    }

    fn attestation_object(&self, auth_data: Vec<u8>) -> Vec<u8> {
        let map = Value::Map(vec![
            (Value::from("fmt"), Value::from("none")),
            (Value::from("attStmt"), Value::Map(vec![])),
            (Value::from("authData"), Value::Bytes(auth_data)),
        ]);
        let mut out = Vec::new();
        ciborium::into_writer(&map, &mut out).unwrap();
        out
    }

    fn sign(&self, auth_data: &[u8], client_data: &[u8]) -> Vec<u8> {
        let mut signed = auth_data.to_vec();
        signed.extend_from_slice(&Sha256::digest(client_data));
        let rng = aws_lc_rs::rand::SystemRandom::new();
        self.key.sign(&rng, &signed).unwrap().as_ref().to_vec()
    }
}

fn client_data(ty: &str, challenge: &[u8], origin: &str, extra: &str) -> Vec<u8> {
    format!(
        r#"{{"type":"{ty}","challenge":"{}","origin":"{origin}"{extra}}}"#,
        URL_SAFE_NO_PAD.encode(challenge)
    )
    .into_bytes()
}

fn portal() -> RelyingParty {
    RelyingParty {
        rp_id: "emisar.example.com".into(),
        origins: vec!["https://emisar.example.com".into()],
    }
}

const CHALLENGE: [u8; 32] = [42; 32];
const UP_UV: u8 = FLAG_UP | FLAG_UV;

/// A valid registration and assertion from the software authenticator, for the test to
/// change one thing in.
fn soft_pair() -> (Soft, PasskeyPublic, Assertion) {
    let soft = Soft::new();
    let reg_cd = client_data(
        "webauthn.create",
        &[1; 32],
        "https://emisar.example.com",
        "",
    );
    let ao = soft.attestation_object(soft.auth_data("emisar.example.com", UP_UV | FLAG_AT, true));
    let key = parse_registration(&portal(), &[1; 32], &ao, &reg_cd).unwrap();
    let cd = client_data(
        "webauthn.get",
        &CHALLENGE,
        "https://emisar.example.com",
        r#","crossOrigin":false,"other_keys_can_be_added_here":"x""#,
    );
    let ad = soft.auth_data("emisar.example.com", UP_UV, false);
    let a = Assertion {
        credential_id: soft.credential_id.clone(),
        signature: soft.sign(&ad, &cd),
        authenticator_data: ad,
        client_data_json: cd,
    };
    verify_assertion(&portal(), &key, &CHALLENGE, &a).unwrap();
    (soft, key, a)
}

/// Changes the assertion's client data and signs it again, so only the changed check fails.
fn resigned(soft: &Soft, a: &Assertion, cd: Vec<u8>, ad: Option<Vec<u8>>) -> Assertion {
    let ad = ad.unwrap_or_else(|| a.authenticator_data.clone());
    Assertion {
        credential_id: a.credential_id.clone(),
        signature: soft.sign(&ad, &cd),
        authenticator_data: ad,
        client_data_json: cd,
    }
}

#[test]
fn each_assertion_check_refuses_what_it_checks() {
    let (soft, key, a) = soft_pair();
    let rp = portal();
    let origin = "https://emisar.example.com";
    let refused = |a: &Assertion| verify_assertion(&rp, &key, &CHALLENGE, a).unwrap_err();

    let wrong_type = resigned(
        &soft,
        &a,
        client_data("webauthn.create", &CHALLENGE, origin, ""),
        None,
    );
    assert_eq!(
        refused(&wrong_type),
        WebauthnError::Type {
            expected: "webauthn.get"
        }
    );

    // A signature made for another statement does not approve this one.
    assert_eq!(
        verify_assertion(&rp, &key, &[43; 32], &a).unwrap_err(),
        WebauthnError::Challenge
    );
    let padded = format!(
        r#"{{"type":"webauthn.get","challenge":"{}=","origin":"{origin}"}}"#,
        URL_SAFE_NO_PAD.encode(CHALLENGE)
    );
    let padded = resigned(&soft, &a, padded.into_bytes(), None);
    assert_eq!(refused(&padded), WebauthnError::Challenge);

    for other in [
        "https://evil.example.com",
        "https://emisar.example.com:8443",
        "http://emisar.example.com",
    ] {
        let wrong_origin = resigned(
            &soft,
            &a,
            client_data("webauthn.get", &CHALLENGE, other, ""),
            None,
        );
        assert_eq!(refused(&wrong_origin), WebauthnError::Origin, "{other}");
    }

    let framed = resigned(
        &soft,
        &a,
        client_data("webauthn.get", &CHALLENGE, origin, r#","crossOrigin":true"#),
        None,
    );
    assert_eq!(refused(&framed), WebauthnError::CrossOrigin);

    let not_json = resigned(&soft, &a, b"{\"type\":".to_vec(), None);
    assert_eq!(refused(&not_json), WebauthnError::ClientDataJson);

    let other_rp = soft.auth_data("evil.example.com", UP_UV, false);
    let other_rp = resigned(&soft, &a, a.client_data_json.clone(), Some(other_rp));
    assert_eq!(refused(&other_rp), WebauthnError::RpIdHash);

    let absent = soft.auth_data("emisar.example.com", FLAG_UV, false);
    let absent = resigned(&soft, &a, a.client_data_json.clone(), Some(absent));
    assert_eq!(refused(&absent), WebauthnError::UserPresent);

    let unverified = soft.auth_data("emisar.example.com", FLAG_UP, false);
    let unverified = resigned(&soft, &a, a.client_data_json.clone(), Some(unverified));
    assert_eq!(refused(&unverified), WebauthnError::UserVerified);

    let mut truncated = a.clone();
    truncated.authenticator_data.truncate(36);
    assert_eq!(
        refused(&truncated),
        WebauthnError::AuthenticatorData { more: "" }
    );

    // The signature covers the authenticator data and the client data's hash: a changed
    // counter, a changed client data byte, or a flipped signature bit are refused.
    let mut counter = a.clone();
    counter.authenticator_data[36] ^= 1;
    assert_eq!(
        refused(&counter),
        WebauthnError::Signature {
            alg: CoseAlg::ES256
        }
    );
    let mut extra = a.clone();
    extra.client_data_json = client_data(
        "webauthn.get",
        &CHALLENGE,
        origin,
        r#","crossOrigin":false,"other_keys_can_be_added_here":"y""#,
    );
    assert_eq!(
        refused(&extra),
        WebauthnError::Signature {
            alg: CoseAlg::ES256
        }
    );
    let mut flipped = a.clone();
    let last = flipped.signature.len() - 1;
    flipped.signature[last] ^= 1;
    assert_eq!(
        refused(&flipped),
        WebauthnError::Signature {
            alg: CoseAlg::ES256
        }
    );

    let mut other_credential = a.clone();
    other_credential.credential_id = vec![8; 16];
    assert_eq!(refused(&other_credential), WebauthnError::CredentialId);

    // Another person's key (same credential id claimed): the signature does not verify.
    let (_, stranger, _) = soft_pair();
    let impostor = PasskeyPublic {
        credential_id: key.credential_id.clone(),
        ..stranger
    };
    assert_eq!(
        verify_assertion(&rp, &impostor, &CHALLENGE, &a).unwrap_err(),
        WebauthnError::Signature {
            alg: CoseAlg::ES256
        }
    );
}

#[test]
fn a_key_whose_alg_does_not_match_is_refused() {
    let (_, es256, a) = soft_pair();
    let as_eddsa = PasskeyPublic {
        alg: CoseAlg::EdDSA,
        ..es256.clone()
    };
    assert_eq!(
        verify_assertion(&portal(), &as_eddsa, &CHALLENGE, &a).unwrap_err(),
        WebauthnError::PublicKey {
            alg: CoseAlg::EdDSA
        }
    );
    let eddsa = register(&vectors::PACKED_EDDSA, Uv::NotRequired).unwrap();
    let as_es256 = PasskeyPublic {
        alg: CoseAlg::ES256,
        credential_id: es256.credential_id.clone(),
        public_key: eddsa.public_key,
    };
    assert_eq!(
        verify_assertion(&portal(), &as_es256, &CHALLENGE, &a).unwrap_err(),
        WebauthnError::PublicKey {
            alg: CoseAlg::ES256
        }
    );
}

#[test]
fn each_registration_check_refuses_what_it_checks() {
    let soft = Soft::new();
    let rp = portal();
    let origin = "https://emisar.example.com";
    let cd = client_data("webauthn.create", &CHALLENGE, origin, "");
    let good = soft.attestation_object(soft.auth_data("emisar.example.com", UP_UV | FLAG_AT, true));
    let key = parse_registration(&rp, &CHALLENGE, &good, &cd).unwrap();
    assert_eq!(key.credential_id, soft.credential_id);
    let reg = |ao: &[u8], cd: &[u8]| parse_registration(&rp, &CHALLENGE, ao, cd).unwrap_err();

    let get = client_data("webauthn.get", &CHALLENGE, origin, "");
    assert_eq!(
        reg(&good, &get),
        WebauthnError::Type {
            expected: "webauthn.create"
        }
    );
    // Someone else's registration challenge (another session, or one already used).
    assert_eq!(
        parse_registration(&rp, &[9; 32], &good, &cd).unwrap_err(),
        WebauthnError::Challenge
    );
    let evil = client_data(
        "webauthn.create",
        &CHALLENGE,
        "https://evil.example.com",
        "",
    );
    assert_eq!(reg(&good, &evil), WebauthnError::Origin);
    let framed = client_data(
        "webauthn.create",
        &CHALLENGE,
        origin,
        r#","crossOrigin":true"#,
    );
    assert_eq!(reg(&good, &framed), WebauthnError::CrossOrigin);
    let other_rp =
        soft.attestation_object(soft.auth_data("evil.example.com", UP_UV | FLAG_AT, true));
    assert_eq!(reg(&other_rp, &cd), WebauthnError::RpIdHash);
    let absent =
        soft.attestation_object(soft.auth_data("emisar.example.com", FLAG_UV | FLAG_AT, true));
    assert_eq!(reg(&absent, &cd), WebauthnError::UserPresent);
    let unverified =
        soft.attestation_object(soft.auth_data("emisar.example.com", FLAG_UP | FLAG_AT, true));
    assert_eq!(reg(&unverified, &cd), WebauthnError::UserVerified);
    let no_at = soft.attestation_object(soft.auth_data("emisar.example.com", UP_UV, true));
    assert_eq!(reg(&no_at, &cd), WebauthnError::NoAttestedCredential);
    assert_eq!(reg(b"\xff\x00", &cd), WebauthnError::AttestationObject);

    // Cut anywhere inside the attested credential data: refused, never a panic.
    let full = soft.auth_data("emisar.example.com", UP_UV | FLAG_AT, true);
    for cut in 37..full.len() {
        let err = reg(&soft.attestation_object(full[..cut].to_vec()), &cd);
        assert!(
            matches!(
                err,
                WebauthnError::AuthenticatorData { .. } | WebauthnError::CoseKey { .. }
            ),
            "cut at {cut}: {err}"
        );
    }
    let short = soft.attestation_object(full[..20].to_vec());
    assert_eq!(
        reg(&short, &cd),
        WebauthnError::AuthenticatorData { more: "" }
    );
}

#[test]
fn cose_keys_of_other_kinds_are_refused_naming_the_rule() {
    let one = |entries: Vec<(i64, Value)>| {
        let map = Value::Map(
            entries
                .into_iter()
                .map(|(k, v)| (Value::from(k), v))
                .collect(),
        );
        let mut out = Vec::new();
        ciborium::into_writer(&map, &mut out).unwrap();
        cose_to_spki(&out).unwrap_err().to_string()
    };
    let xy = || Value::Bytes(vec![1; 32]);
    // ES384 (alg -35, P-384): not a passkey algorithm we accept.
    let es384 = one(vec![
        (1, 2.into()),
        (3, (-35).into()),
        (-1, 2.into()),
        (-2, xy()),
        (-3, xy()),
    ]);
    assert!(es384.contains("(kty, alg, crv) must be"), "{es384}");
    // RS256.
    let rs256 = one(vec![(1, 3.into()), (3, (-257).into())]);
    assert!(rs256.contains("(kty, alg, crv) must be"), "{rs256}");
    // A point not on the curve.
    let off = one(vec![
        (1, 2.into()),
        (3, (-7).into()),
        (-1, 1.into()),
        (-2, xy()),
        (-3, xy()),
    ]);
    assert!(off.contains("not on P-256"), "{off}");
    // A short coordinate.
    let short = one(vec![
        (1, 2.into()),
        (3, (-7).into()),
        (-1, 1.into()),
        (-2, Value::Bytes(vec![1; 31])),
        (-3, xy()),
    ]);
    assert!(short.contains("not 32 bytes"), "{short}");
    // The same label twice.
    let twice = one(vec![(1, 2.into()), (1, 2.into()), (3, (-7).into())]);
    assert!(twice.contains("appears twice"), "{twice}");
}

#[test]
fn errors_name_the_check_and_never_the_bytes() {
    let (_soft, key, mut a) = soft_pair();
    a.client_data_json =
        br#"{"type":"webauthn.get","challenge":"c2VjcmV0","origin":"https://attacker.invalid"}"#
            .to_vec();
    let err = verify_assertion(&portal(), &key, &CHALLENGE, &a)
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("clientDataJSON.challenge"), "{err}");
    assert!(
        !err.contains("c2VjcmV0") && !err.contains("attacker"),
        "{err}"
    );
}

/// WebAuthn L3 §7.2, the signCount step: a counter that does not grow is a clone's.
#[test]
fn a_signature_counter_must_grow_unless_the_authenticator_keeps_none() {
    // No counter kept (synced passkeys report 0): nothing to remember, nothing refused.
    assert_eq!(check_sign_count(0, 0), Ok(None));
    // The first counter seen, and each greater one, is remembered.
    assert_eq!(check_sign_count(0, 1), Ok(Some(1)));
    assert_eq!(check_sign_count(5, 6), Ok(Some(6)));
    assert_eq!(check_sign_count(5, u32::MAX), Ok(Some(u32::MAX)));
    // The same counter again, an older one, or none from an authenticator that kept one.
    for (stored, asserted) in [(5, 5), (5, 4), (5, 0), (u32::MAX, u32::MAX)] {
        let err = check_sign_count(stored, asserted).unwrap_err();
        assert_eq!(err, WebauthnError::SignCount { stored, asserted });
        let text = err.to_string();
        assert!(
            text.starts_with("authenticatorData.signCount must be greater than")
                && text.contains("cloned"),
            "{text}"
        );
    }
}

#[test]
fn the_signature_counter_is_read_from_the_authenticator_data() {
    let soft = Soft::new();
    // The software authenticator counts 1 in both ceremonies.
    let ad = soft.auth_data("emisar.example.com", UP_UV, false);
    assert_eq!(sign_count(&ad), Ok(1));
    let ao = soft.attestation_object(soft.auth_data("emisar.example.com", UP_UV | FLAG_AT, true));
    assert_eq!(registration_sign_count(&ao), Ok(1));
    let mut counted = ad.clone();
    counted[33..37].copy_from_slice(&0x0102_0304u32.to_be_bytes());
    assert_eq!(sign_count(&counted), Ok(0x0102_0304));
    assert!(matches!(
        sign_count(&ad[..36]),
        Err(WebauthnError::AuthenticatorData { .. })
    ));
    // The W3C vectors' authenticators keep no counter.
    assert_eq!(
        sign_count(&h(vectors::PACKED_ES256.authenticator_data)),
        Ok(0)
    );
}
