//! `Region`: creation, sealing, opening from a descriptor, bounds and alignment checks.

use std::fs::{File, OpenOptions};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::Ordering;

use exanet_shm::{Region, RegionError};

#[test]
fn create_rejects_bad_arguments() {
    assert!(matches!(Region::create("x", 0), Err(RegionError::Empty)));
    assert!(matches!(
        Region::create("nul\0name", 4096),
        Err(RegionError::InvalidName)
    ));
    assert!(matches!(
        Region::create("huge", usize::MAX),
        Err(RegionError::TooLarge { .. })
    ));
}

#[test]
fn read_write_round_trip_and_bounds() {
    let r = Region::create("rw", 1000).unwrap();
    r.write(0, b"hello").unwrap();
    r.write(995, b"world").unwrap();
    let mut buf = [0u8; 5];
    r.read(995, &mut buf).unwrap();
    assert_eq!(&buf, b"world");
    r.read(0, &mut buf).unwrap();
    assert_eq!(&buf, b"hello");

    // Empty accesses at the very end are fine, anything past it is not.
    r.write(1000, &[]).unwrap();
    r.read(1000, &mut []).unwrap();
    for (offset, len) in [
        (996, 5),
        (1000, 1),
        (1001, 0),
        (usize::MAX, 1),
        (usize::MAX - 2, 5),
    ] {
        let mut buf = vec![0u8; len];
        match r.read(offset, &mut buf) {
            Err(RegionError::OutOfBounds {
                offset: o,
                len: l,
                region_len: 1000,
            }) => {
                assert_eq!((o, l), (offset, len))
            }
            other => panic!("read({offset}, {len}): {other:?}"),
        }
        assert!(matches!(
            r.write(offset, &buf),
            Err(RegionError::OutOfBounds { .. })
        ));
    }
}

#[test]
fn atomics_are_checked_for_bounds_and_alignment() {
    let r = Region::create("atomics", 64).unwrap();
    let a = r.atomic_u32(8).unwrap();
    a.store(7, Ordering::Release);
    assert_eq!(a.fetch_add(3, Ordering::AcqRel), 7);
    assert_eq!(
        a.compare_exchange(10, 11, Ordering::AcqRel, Ordering::Acquire),
        Ok(10)
    );
    assert_eq!(
        a.compare_exchange(10, 12, Ordering::AcqRel, Ordering::Acquire),
        Err(11)
    );
    assert_eq!(a.swap(1, Ordering::AcqRel), 11);
    let mut bytes = [0u8; 4];
    r.read(8, &mut bytes).unwrap();
    assert_eq!(u32::from_ne_bytes(bytes), 1);

    let b = r.atomic_u64(56).unwrap();
    b.store(u64::MAX, Ordering::Release);
    assert_eq!(b.fetch_add(2, Ordering::AcqRel), u64::MAX);
    assert_eq!(b.load(Ordering::Acquire), 1);

    assert!(matches!(
        r.atomic_u32(2),
        Err(RegionError::Misaligned {
            offset: 2,
            align: 4
        })
    ));
    assert!(matches!(
        r.atomic_u64(4),
        Err(RegionError::Misaligned {
            offset: 4,
            align: 8
        })
    ));
    assert!(matches!(
        r.atomic_u32(64),
        Err(RegionError::OutOfBounds { .. })
    ));
    assert!(matches!(
        r.atomic_u32(62),
        Err(RegionError::OutOfBounds { .. })
    ));
    assert!(matches!(
        r.atomic_u64(64),
        Err(RegionError::OutOfBounds { .. })
    ));
    assert!(matches!(
        r.atomic_u64(usize::MAX - 3),
        Err(RegionError::OutOfBounds { .. })
    ));
}

#[test]
fn second_mapping_sees_the_same_memory() {
    let a = Region::create("shared", 4096).unwrap();
    let b = Region::from_fd_with_len(a.try_clone_fd().unwrap(), 4096).unwrap();
    a.write(100, b"ping").unwrap();
    let mut buf = [0u8; 4];
    b.read(100, &mut buf).unwrap();
    assert_eq!(&buf, b"ping");
    b.atomic_u32(200).unwrap().store(42, Ordering::Release);
    assert_eq!(a.atomic_u32(200).unwrap().load(Ordering::Acquire), 42);
    // The second mapping survives the first.
    drop(a);
    b.read(100, &mut buf).unwrap();
    assert_eq!(&buf, b"ping");
}

#[test]
fn size_is_sealed() {
    let r = Region::create("sealed", 8192).unwrap();
    let file = File::from(r.try_clone_fd().unwrap());
    assert!(file.set_len(4096).is_err(), "shrinking must be refused");
    assert!(file.set_len(16384).is_err(), "growing must be refused");
    assert_eq!(file.metadata().unwrap().len(), 8192);
}

#[test]
fn open_checks_the_agreed_size() {
    let r = Region::create("sized", 8192).unwrap();
    match Region::from_fd_with_len(r.try_clone_fd().unwrap(), 4096) {
        Err(RegionError::SizeMismatch {
            expected: 4096,
            actual: 8192,
        }) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(
        Region::from_fd(r.try_clone_fd().unwrap()).unwrap().len(),
        8192
    );
}

/// A plain tmpfs file (what `shm_open` gives) has no seals and cannot get any.
#[test]
fn unsealed_tmpfs_file_is_refused() {
    let path = format!("/dev/shm/exanet-shm-test-{}", std::process::id());
    let file = match OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
    {
        Ok(f) => f,
        // No /dev/shm in this sandbox: the memfd cases are covered by the unit tests.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
        Err(e) => panic!("{e}"),
    };
    let _ = std::fs::remove_file(&path);
    file.set_len(4096).unwrap();
    let fd: OwnedFd = file.into();
    assert!(matches!(Region::from_fd(fd), Err(RegionError::NotSealable)));
}

/// A regular file on disk does not support sealing at all.
#[test]
fn regular_file_is_refused() {
    let file = File::open(std::env::current_exe().unwrap()).unwrap();
    let fd: OwnedFd = file.as_fd().try_clone_to_owned().unwrap();
    assert!(matches!(Region::from_fd(fd), Err(RegionError::NotSealable)));
}
