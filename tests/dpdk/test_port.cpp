// dpdk/: the MTU quirk (no EAL needed) and port bring-up on net_null and net_ring ports of an EAL
// initialised once in main(), with no huge pages and no PCI.
#include <gtest/gtest.h>
#include <rte_bus.h>
#include <rte_dev.h>
#include <rte_eal.h>
#include <rte_ethdev.h>
#include <sched.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "../support/test_eal.h"
#include "treeduce/dpdk/port.h"
#include "treeduce/dpdk/quirks.h"

namespace dpdk = treeduce::dpdk;
using treeduce::Code;

namespace {

TEST(Quirks, MemifAndAfPacketGetTheMtuTheyAdvertise) {
  // 1518-byte frames advertised: a 9000 MTU is configured as 1500, the frames then decide.
  EXPECT_EQ(dpdk::configurable_mtu("net_memif", 1518, 9000), 1500);
  EXPECT_EQ(dpdk::configurable_mtu("net_af_packet", 1518, 9000), 1500);
  // What fits is configured as asked.
  EXPECT_EQ(dpdk::configurable_mtu("net_memif", 1518, 1500), 1500);
  EXPECT_EQ(dpdk::configurable_mtu("net_memif", 1518, 1400), 1400);
  // Other PMDs are taken at their word: ethdev refuses what they cannot do.
  EXPECT_EQ(dpdk::configurable_mtu("net_ixgbe", 1518, 9000), 9000);
  EXPECT_EQ(dpdk::configurable_mtu(nullptr, 1518, 9000), 9000);
  // A PMD advertising nothing usable is not second-guessed.
  EXPECT_EQ(dpdk::configurable_mtu("net_memif", 18, 9000), 9000);
}

TEST(Port, AMissingPortNamesTheProbedOnes) {
  treeduce::Result<std::uint16_t> r = dpdk::find_port("net_memif7");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::not_found);
  EXPECT_EQ(r.status().message(),
            "There is no DPDK port 'net_memif7' (the EAL probed net_null0, net_ring0).");
}

TEST(Port, ComesUpWithTheQueuesMtuAndMacAsked) {
  treeduce::Result<std::uint16_t> id = dpdk::find_port("net_ring0");
  ASSERT_TRUE(id.ok()) << id.status().message();
  treeduce::Result<rte_eth_dev_info> info = dpdk::device_info(*id, "net_ring0");
  ASSERT_TRUE(info.ok()) << info.status().message();
  treeduce::Result<rte_mempool*> pool = dpdk::create_pool(
      "test_port_rx", 1023, 32, RTE_MBUF_DEFAULT_BUF_SIZE, dpdk::port_socket(*id));
  ASSERT_TRUE(pool.ok()) << pool.status().message();
  dpdk::PortRequest req;
  req.name = "net_ring0";
  req.rx_queues = 16;  // more than the PMD has: it gets what there is
  req.rx_desc = 256;
  req.tx_desc = 256;
  req.min_mtu = 1400;  // below the port's own: the port's own stays
  req.rx_pool = *pool;
  req.mac = dpdk::Mac{0x02, 0, 0, 0, 0, 0x42};
  treeduce::Result<dpdk::PortUp> up = dpdk::start_port(*id, *info, req);
  ASSERT_TRUE(up.ok()) << up.status().message();
  EXPECT_EQ(up->rx_queues, std::min<std::uint16_t>(16, info->max_rx_queues));
  EXPECT_EQ(up->mtu, 1500);
  EXPECT_EQ(up->configured_mtu, 1500);
  EXPECT_EQ(up->mac, *req.mac);
  rte_eth_dev_stop(*id);
  rte_mempool_free(*pool);
}

TEST(Port, APoolTheEalCannotHoldIsOneSentence) {
  treeduce::Result<rte_mempool*> pool =
      dpdk::create_pool("test_port_huge", 1u << 24, 0, 9000, SOCKET_ID_ANY);
  ASSERT_FALSE(pool.ok());
  EXPECT_EQ(pool.status().code(), Code::resource_exhausted);
  EXPECT_NE(pool.status().message().find("pool 'test_port_huge'"), std::string::npos)
      << pool.status().message();
}

bool g_own_netns = false;  // main() moved the process into a network namespace of its own

TEST(Quirks, AfPacketFramesBoundTheMtu) {
  EXPECT_EQ(dpdk::af_packet_framesz("iface=veth0,qpairs=2,framesz=8480,blocksz=1085440"), 8480u);
  EXPECT_EQ(dpdk::af_packet_framesz("framesz=4096"), 4096u);
  EXPECT_EQ(dpdk::af_packet_framesz("iface=veth0"), 2048u) << "the PMD's default";
  EXPECT_EQ(dpdk::af_packet_framesz(""), 2048u);
  EXPECT_EQ(dpdk::af_packet_framesz("iface=xframesz=1,framesz=x"), 0u);
  // The lab's jumbo ring frames (lab/src/emulated_fabric.cpp) hold MTU 8400; the default 1968.
  EXPECT_EQ(dpdk::af_packet_max_mtu(8480), 8400u);
  EXPECT_EQ(dpdk::af_packet_max_mtu(2048), 1968u);
  EXPECT_EQ(dpdk::af_packet_max_mtu(64), 0u);
}

// A real net_af_packet port (on the loopback device of this process's own network namespace):
// an MTU its ring frames cannot carry is refused at start-up with the framesz it needs, instead
// of a port that says jumbo frames pass and then drops every one as ip_bad_length; ring frames
// larger than the pool's mbufs are refused too; what fits comes up.
TEST(Port, AfPacketRingFramesTooSmallForTheMtuAreRefused) {
  if (!g_own_netns) GTEST_SKIP() << "needs a network namespace of its own (root)";
  const struct {
    const char* vdev;
    std::uint16_t mtu;
    std::string refusal;  // "" = comes up
  } cases[] = {
      {"net_af_packet1,iface=lo", 8300,
       "DPDK port 'net_af_packet1' (net_af_packet, framesz=2048) carries IP packets of at most "
       "1968 bytes (framesz - 80: the kernel writes each frame 66 bytes into a ring frame and "
       "cuts what does not fit), but its MTU is 8300: give the vdev framesz=8384 or more (with "
       "blocksz a multiple of it), or the port an MTU of at most 1968."},
      {"net_af_packet2,iface=lo,framesz=8480,blocksz=1085440", 8300,
       "DPDK port 'net_af_packet2' (net_af_packet, framesz=8480) copies up to framesz - 32 = 8448 "
       "bytes into one mbuf, but the mbufs hold 2048: give it framesz=2080 or less."},
      {"net_af_packet3,iface=lo", 1968, ""},
  };
  treeduce::Result<rte_mempool*> pool =
      dpdk::create_pool("test_port_afp", 1023, 32, RTE_MBUF_DEFAULT_BUF_SIZE, SOCKET_ID_ANY);
  ASSERT_TRUE(pool.ok()) << pool.status().message();
  for (const auto& c : cases) {
    SCOPED_TRACE(c.vdev);
    ASSERT_EQ(rte_dev_probe(c.vdev), 0);
    const std::string name = std::string(c.vdev).substr(0, std::string(c.vdev).find(','));
    treeduce::Result<std::uint16_t> id = dpdk::find_port(name);
    ASSERT_TRUE(id.ok()) << id.status().message();
    treeduce::Result<rte_eth_dev_info> info = dpdk::device_info(*id, name);
    ASSERT_TRUE(info.ok()) << info.status().message();
    dpdk::PortRequest req;
    req.name = name;
    req.rx_desc = 64;
    req.tx_desc = 64;
    req.mtu = c.mtu;
    req.rx_pool = *pool;
    treeduce::Result<dpdk::PortUp> up = dpdk::start_port(*id, *info, req);
    if (c.refusal.empty()) {
      ASSERT_TRUE(up.ok()) << up.status().message();
      EXPECT_EQ(up->mtu, c.mtu);
      rte_eth_dev_stop(*id);
    } else {
      ASSERT_FALSE(up.ok());
      EXPECT_EQ(up.status().code(), Code::failed_precondition);
      EXPECT_EQ(up.status().message(), c.refusal);
    }
    rte_eth_dev_close(*id);
  }
  rte_mempool_free(*pool);
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  // net_af_packet ports are tried on the loopback device of a network namespace of this
  // process's own (nothing outside it is touched); without the privilege that test skips.
  g_own_netns = unshare(CLONE_NEWNET) == 0;
  if (!treeduce::test_support::init_test_eal(argv[0], "tddpdkport", {"net_null0", "net_ring0"}))
    return 1;
  const int rc = RUN_ALL_TESTS();
  rte_eal_cleanup();
  return rc;
}
