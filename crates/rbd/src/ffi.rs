//! The part of librados's and librbd's C API arcache uses, declared by hand
//! from Debian 12's librados-dev and librbd-dev 16.2 (`/usr/include/rados/
//! librados.h`, `/usr/include/rbd/librbd.h`, `LIBRBD_VER` 1.16.0). Every
//! call returns 0 or a byte count on success and `-errno` on failure.

use libc::{c_char, c_int, c_void, size_t, ssize_t};

pub type RadosT = *mut c_void;
pub type RadosIoctxT = *mut c_void;
pub type RbdImageT = *mut c_void;

/// `rbd_lock_mode_t`'s `RBD_LOCK_MODE_EXCLUSIVE`.
pub const RBD_LOCK_MODE_EXCLUSIVE: c_int = 0;

/// `RBD_FEATURE_EXCLUSIVE_LOCK` (`/usr/include/rbd/features.h`).
pub const RBD_FEATURE_EXCLUSIVE_LOCK: u64 = 1 << 2;

/// `rbd_image_info_t`; of it arcache reads `size` and `obj_size`.
#[repr(C)]
pub struct RbdImageInfo {
    pub size: u64,
    pub obj_size: u64,
    pub num_objs: u64,
    pub order: c_int,
    pub block_name_prefix: [c_char; 24],
    pub parent_pool: i64,
    pub parent_name: [c_char; 96],
}

#[link(name = "rados")]
extern "C" {
    pub fn rados_create2(
        cluster: *mut RadosT,
        clustername: *const c_char,
        name: *const c_char,
        flags: u64,
    ) -> c_int;
    pub fn rados_conf_read_file(cluster: RadosT, path: *const c_char) -> c_int;
    pub fn rados_conf_parse_env(cluster: RadosT, var: *const c_char) -> c_int;
    pub fn rados_conf_set(cluster: RadosT, option: *const c_char, value: *const c_char) -> c_int;
    pub fn rados_connect(cluster: RadosT) -> c_int;
    pub fn rados_cluster_fsid(cluster: RadosT, buf: *mut c_char, len: size_t) -> c_int;
    pub fn rados_shutdown(cluster: RadosT);
    pub fn rados_ioctx_create(cluster: RadosT, pool_name: *const c_char, ioctx: *mut RadosIoctxT) -> c_int;
    pub fn rados_ioctx_destroy(io: RadosIoctxT);
}

#[link(name = "rbd")]
extern "C" {
    pub fn rbd_open(
        io: RadosIoctxT,
        name: *const c_char,
        image: *mut RbdImageT,
        snap_name: *const c_char,
    ) -> c_int;
    pub fn rbd_open_read_only(
        io: RadosIoctxT,
        name: *const c_char,
        image: *mut RbdImageT,
        snap_name: *const c_char,
    ) -> c_int;
    pub fn rbd_close(image: RbdImageT) -> c_int;
    pub fn rbd_stat(image: RbdImageT, info: *mut RbdImageInfo, infosize: size_t) -> c_int;
    pub fn rbd_get_id(image: RbdImageT, id: *mut c_char, id_len: size_t) -> c_int;
    pub fn rbd_snap_get_id(image: RbdImageT, snapname: *const c_char, snap_id: *mut u64) -> c_int;
    pub fn rbd_read2(image: RbdImageT, ofs: u64, len: size_t, buf: *mut c_char, op_flags: c_int) -> ssize_t;
    pub fn rbd_write2(
        image: RbdImageT,
        ofs: u64,
        len: size_t,
        buf: *const c_char,
        op_flags: c_int,
    ) -> ssize_t;
    pub fn rbd_discard(image: RbdImageT, ofs: u64, len: u64) -> c_int;
    pub fn rbd_write_zeroes(
        image: RbdImageT,
        ofs: u64,
        len: size_t,
        zero_flags: c_int,
        op_flags: c_int,
    ) -> ssize_t;
    pub fn rbd_flush(image: RbdImageT) -> c_int;
    pub fn rbd_lock_acquire(image: RbdImageT, lock_mode: c_int) -> c_int;
    pub fn rbd_lock_release(image: RbdImageT) -> c_int;
    pub fn rbd_lock_get_owners(
        image: RbdImageT,
        lock_mode: *mut c_int,
        lock_owners: *mut *mut c_char,
        max_lock_owners: *mut size_t,
    ) -> c_int;
    pub fn rbd_lock_get_owners_cleanup(lock_owners: *mut *mut c_char, lock_owner_count: size_t);
    pub fn rbd_metadata_get(
        image: RbdImageT,
        key: *const c_char,
        value: *mut c_char,
        val_len: *mut size_t,
    ) -> c_int;
    pub fn rbd_metadata_set(image: RbdImageT, key: *const c_char, value: *const c_char) -> c_int;
    pub fn rbd_get_features(image: RbdImageT, features: *mut u64) -> c_int;
}
