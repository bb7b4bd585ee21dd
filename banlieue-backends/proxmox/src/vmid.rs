//! Safe VMID allocation.
//!
//! PVE has no "allocate" call: `GET /cluster/nextid` only suggests the lowest free ID,
//! so two clients asking at once get the same one. The clone itself is the
//! reservation: PVE creates the new VM's config file atomically and refuses a taken
//! ID (`unable to create VM N: config file already exists`). The backend therefore
//! serializes its own allocations (one lock per Provider) and, against other
//! writers, retries with the next candidate when a clone finds its ID taken.

use std::collections::BTreeSet;

use banlieue_sdk::api::infra::proxmox::VmIdRange;

/// Clone attempts before giving up with a transient `VMIDConflict`.
pub const MAX_ATTEMPTS: usize = 16;

/// PVE's lowest VMID.
pub const MIN_VMID: u32 = 100;

/// PVE's highest VMID.
pub const MAX_VMID: u32 = 999_999_999;

/// Picks VMID candidates: the lowest free ID in `vmIDRange` when one is given, else
/// PVE's suggestion from `/cluster/nextid`, skipping IDs known to be used or already
/// tried.
#[derive(Clone, Debug)]
pub struct VmidPicker {
    range: Option<(u32, u32)>,
    used: BTreeSet<u32>,
}

impl VmidPicker {
    /// A picker for `range` (or the whole VMID space), given the IDs in use.
    pub fn new(range: Option<&VmIdRange>, used: BTreeSet<u32>) -> Self {
        Self {
            range: range.map(|r| (r.start.max(MIN_VMID), r.end.min(MAX_VMID))),
            used,
        }
    }

    /// True when a range is set (then `/cluster/nextid` is not asked).
    pub fn has_range(&self) -> bool {
        self.range.is_some()
    }

    /// The next candidate, marking it used; `None` when the range is exhausted.
    /// `suggested` is `/cluster/nextid`'s answer (ignored with a range).
    pub fn next(&mut self, suggested: Option<u32>) -> Option<u32> {
        let (start, end) = self
            .range
            .unwrap_or((suggested.unwrap_or(MIN_VMID).max(MIN_VMID), MAX_VMID));
        let mut id = start;
        while id <= end {
            if self.used.insert(id) {
                return Some(id);
            }
            id = id.checked_add(1)?;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn follows_pves_suggestion_and_skips_what_it_tried() {
        let mut picker = VmidPicker::new(None, BTreeSet::from([9000]));
        assert!(!picker.has_range());
        assert_eq!(picker.next(Some(100)), Some(100));
        // PVE suggests 100 again (the racing clone has not landed yet): move on.
        assert_eq!(picker.next(Some(100)), Some(101));
        assert_eq!(picker.next(None), Some(102));
        assert_eq!(picker.next(Some(8999)), Some(8999));
        assert_eq!(picker.next(Some(8999)), Some(9001));
    }

    #[test]
    fn honours_the_range() {
        let range = VmIdRange {
            start: 500,
            end: 502,
        };
        let mut picker = VmidPicker::new(Some(&range), BTreeSet::from([501]));
        assert!(picker.has_range());
        assert_eq!(picker.next(Some(100)), Some(500));
        assert_eq!(picker.next(Some(100)), Some(502));
        assert_eq!(picker.next(Some(100)), None);
    }
}
