//! The config file and the option parsers `serve` uses: any text gives a
//! value or an error, never a panic, and whatever is accepted resolves
//! to settings (or an error) without opening anything.
#![no_main]

use arcache::config::{resolve_tls, split_export, ConfigFile, Listen};
use arcache::serve::{parse_l2, resolve_with, ServeArgs};
use arcache::size::parse_size;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(file) = ConfigFile::parse(text) {
        let _ = resolve_with(&ServeArgs::default(), file);
    }
    // One-line values: each parser sees every line of the input.
    for line in text.lines() {
        let _ = Listen::parse(line);
        let _ = parse_size(line);
        let _ = split_export(line);
        let _ = parse_l2(line);
        let _ = nbd::NbdUri::parse(line);
        let _ = arcache_rbd::RbdSpec::parse(line);
        let _ = arcache::tunables::parse_value("zfs_arc_max", line);
        let _ = arcache::tunables::parse_value("sync", line);
        let _ = resolve_tls(Some(line), None, None, None);
    }
});
