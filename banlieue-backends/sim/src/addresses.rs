//! The per-world `InternalIP` allocator.

use std::net::Ipv4Addr;

/// Hands out `10.x.y.z` addresses (never `.0` or `.255`), each unique among the
/// machines that exist. Fresh addresses first; freed ones only once the fresh run out.
#[derive(Debug)]
pub(crate) struct AddressPool {
    next: u32,
    free: Vec<u32>,
}

impl Default for AddressPool {
    fn default() -> Self {
        Self {
            next: 1,
            free: Vec::new(),
        }
    }
}

impl AddressPool {
    const SIZE: u32 = 1 << 24;

    pub(crate) fn allocate(&mut self) -> Option<Ipv4Addr> {
        while self.next < Self::SIZE {
            let n = self.next;
            self.next += 1;
            if !matches!(n & 0xff, 0 | 255) {
                return Some(Self::addr(n));
            }
        }
        self.free.pop().map(Self::addr)
    }

    pub(crate) fn release(&mut self, addr: Ipv4Addr) {
        self.free.push(u32::from(addr) & (Self::SIZE - 1));
    }

    fn addr(n: u32) -> Ipv4Addr {
        Ipv4Addr::from((10 << 24) | n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_skip_network_and_broadcast_octets() {
        let mut pool = AddressPool::default();
        let first: Vec<Ipv4Addr> = (0..300).map(|_| pool.allocate().unwrap()).collect();
        assert_eq!(first[0], Ipv4Addr::new(10, 0, 0, 1));
        assert_eq!(first[253], Ipv4Addr::new(10, 0, 0, 254));
        assert_eq!(first[254], Ipv4Addr::new(10, 0, 1, 1));
        assert!(first.iter().all(|a| !matches!(a.octets()[3], 0 | 255)));
    }

    #[test]
    fn freed_addresses_are_reused_only_when_fresh_ones_run_out() {
        let mut pool = AddressPool::default();
        let a = pool.allocate().unwrap();
        pool.release(a);
        assert_ne!(pool.allocate().unwrap(), a);
        pool.next = AddressPool::SIZE;
        assert_eq!(pool.allocate(), Some(a));
        assert_eq!(pool.allocate(), None);
    }
}
