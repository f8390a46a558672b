//! Tests of `[storage.cold]`: parsing, defaults, validation.

use super::*;

#[test]
fn backend_names_and_aliases() {
    for (s, b) in [
        ("local", Backend::Local),
        ("S3", Backend::S3),
        ("memory", Backend::Memory),
        ("mem", Backend::Memory),
        ("inmem", Backend::Memory),
        ("none", Backend::None),
        ("disabled", Backend::None),
        ("off", Backend::None),
    ] {
        assert_eq!(s.parse::<Backend>().unwrap(), b, "{s}");
    }
    assert!("gcs".parse::<Backend>().is_err());
}

#[test]
fn defaults_and_invalid_combinations() {
    let c = ColdConfig::default();
    assert_eq!(c.backend(false).unwrap(), Backend::Local);
    assert!(matches!(
        c.backend(true),
        Err(ColdConfigError::BackendRequired)
    ));
    assert_eq!(c.local_path(Path::new("/d")), PathBuf::from("/d/cold"));
    let s3 = ColdConfig {
        backend: Some(Backend::S3),
        ..Default::default()
    };
    assert!(matches!(
        s3.backend(false),
        Err(ColdConfigError::MissingBucket)
    ));
    let mem = ColdConfig {
        backend: Some(Backend::Memory),
        ..Default::default()
    };
    assert!(matches!(
        mem.backend(true),
        Err(ColdConfigError::MemoryWithPeers)
    ));
    let local = ColdConfig {
        backend: Some(Backend::Local),
        ..Default::default()
    };
    assert!(matches!(
        local.backend(true),
        Err(ColdConfigError::LocalNotShared)
    ));
    let bad_root = ColdConfig {
        root: Some("a/../b".into()),
        ..Default::default()
    };
    assert!(matches!(
        bad_root.validate(false),
        Err(ColdConfigError::InvalidRoot(_))
    ));
}

#[test]
fn flush_runs_default_from_the_thresholds_and_stay_under_the_cap() {
    let mut local = ColdConfig::default();
    local.resolve_defaults(false, 1);
    assert_eq!(local.flush_min_hot_size(), 1 << 20);
    assert_eq!(local.max_hot_size_per_group(), 256 << 20);
    let mut four = ColdConfig::default();
    four.resolve_defaults(false, 4);
    assert_eq!(four.max_hot_size_per_group(), 64 << 20);
    let mut many = ColdConfig::default();
    many.resolve_defaults(true, 16);
    assert_eq!(many.max_hot_size_per_group(), 64 << 20);
    assert_eq!(local.flush_min_run(), 64 << 10);
    assert_eq!(local.flush_any_hot_size(), 16 << 20);
    let small: ColdConfig =
        toml::from_str("flush_size = \"64KiB\"\nmax_hot_size_per_group = \"512KiB\"\n").unwrap();
    assert_eq!(small.flush_min_run(), 4 << 10);
    assert_eq!(small.flush_any_hot_size(), 128 << 10);
    let uncapped = ColdConfig {
        max_hot_size_per_group: Some(0),
        ..Default::default()
    };
    assert_eq!(uncapped.flush_any_hot_size(), 16 << 20);
    let set: ColdConfig =
        toml::from_str("flush_min_run = \"1KiB\"\nflush_any_hot_size = \"32MiB\"\n").unwrap();
    assert_eq!(
        (set.flush_min_run(), set.flush_any_hot_size()),
        (1 << 10, 32 << 20)
    );
    assert!(set.validate(false).is_ok());
    let over: ColdConfig = toml::from_str("flush_any_hot_size = \"65MiB\"\n").unwrap();
    assert!(matches!(
        over.validate(false),
        Err(ColdConfigError::FlushAboveHotBound)
    ));
}

#[test]
fn toml_keys() {
    let c: ColdConfig = toml::from_str(
        "backend = \"s3\"\nroot = \"run-1\"\n[s3]\nbucket = \"b\"\nendpoint = \"http://127.0.0.1:1\"\ntimeout = \"500ms\"\n[local]\nshared = true\n",
    )
    .unwrap();
    assert_eq!(c.backend(false).unwrap(), Backend::S3);
    assert_eq!(c.s3.timeout, Duration::from_millis(500));
    assert!(c.local.shared);
    assert_eq!(c.s3.server_side_encryption, Encryption::Aes256);
    let secret: ColdConfig =
        toml::from_str("[s3]\naccess_key_id = \"id\"\nsecret_access_key = \"hunter2\"\n").unwrap();
    assert!(!format!("{secret:?}").contains("hunter2"));
    let kms: ColdConfig = toml::from_str(
        "backend = \"s3\"\n[s3]\nbucket = \"b\"\nserver_side_encryption = \"none\"\nkms_key_id = \"k\"\n",
    )
    .unwrap();
    assert_eq!(kms.s3.server_side_encryption, Encryption::None);
    assert!(matches!(
        kms.backend(false),
        Err(ColdConfigError::KmsKeyWithoutKms)
    ));
    assert!(toml::from_str::<ColdConfig>("[s3]\nserver_side_encryption = \"rot13\"").is_err());
    assert!(toml::from_str::<ColdConfig>("backend = \"tape\"").is_err());
    assert!(toml::from_str::<ColdConfig>("bogus = 1").is_err());
    assert_eq!(parse_duration("1d").unwrap(), Duration::from_secs(86_400));
    assert!(parse_duration("5 weeks").is_err());
    assert!(parse_duration("").is_err());
}
