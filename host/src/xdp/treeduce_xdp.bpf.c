// The XDP program of the af_xdp transport (host/src/af_xdp_transport.h): redirects to the AF_XDP
// socket of its queue only IPv4/UDP frames to the one address and port the transport receives
// on, and passes everything else to the kernel (ARP, the control connection to the Aggregation
// Manager, ssh, other UDP ports). libxdp's default program (xsk_def_prog) cannot be used: it
// redirects every frame of the queue to the socket, so a host's kernel would stop seeing ARP and
// TCP on that interface.
//
// Built with clang -target bpf at build time (host/meson.build) and embedded in libtreeduce.
// The transport writes the address to match into td_match before attaching the program.
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/udp.h>

#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

// What to redirect: IPv4 destination address and UDP destination port, both in network order.
struct td_match {
  __u32 ip;
  __u16 port;
  __u16 pad;
};

// Counters the transport reads: frames that matched, and frames that matched but found no socket
// on their queue (a multi-queue NIC spreading our flow to another queue; they go to the kernel).
enum { TD_MATCHED = 0, TD_NO_SOCKET = 1, TD_COUNTERS = 2 };

struct {
  __uint(type, BPF_MAP_TYPE_XSKMAP);
  __uint(max_entries, 256);
  __type(key, __u32);
  __type(value, __u32);
} td_xsks SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, struct td_match);
} td_match SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, TD_COUNTERS);
  __type(key, __u32);
  __type(value, __u64);
} td_counts SEC(".maps");

static __always_inline void count(__u32 which) {
  __u64* c = bpf_map_lookup_elem(&td_counts, &which);
  if (c) __sync_fetch_and_add(c, 1);
}

SEC("xdp")
int treeduce_xdp(struct xdp_md* ctx) {
  void* data = (void*)(long)ctx->data;
  void* end = (void*)(long)ctx->data_end;
  struct ethhdr* eth = data;
  if ((void*)(eth + 1) > end || eth->h_proto != bpf_htons(ETH_P_IP)) return XDP_PASS;
  struct iphdr* ip = (void*)(eth + 1);
  // Treeduce sends IPv4 without options and never fragments (DF): anything else is the kernel's.
  if ((void*)(ip + 1) > end || ip->version != 4 || ip->ihl != 5 || ip->protocol != IPPROTO_UDP ||
      (ip->frag_off & bpf_htons(0x3fff)) != 0)
    return XDP_PASS;
  struct udphdr* udp = (void*)(ip + 1);
  if ((void*)(udp + 1) > end) return XDP_PASS;
  __u32 zero = 0;
  struct td_match* m = bpf_map_lookup_elem(&td_match, &zero);
  if (!m || udp->dest != m->port || ip->daddr != m->ip) return XDP_PASS;
  count(TD_MATCHED);
  long r = bpf_redirect_map(&td_xsks, ctx->rx_queue_index, XDP_PASS);
  if (r != XDP_REDIRECT) count(TD_NO_SOCKET);
  return (int)r;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
