// dpdk/: the MTU quirk (no EAL needed) and port bring-up on net_null and net_ring ports of an EAL
// initialised once in main(), with no huge pages and no PCI.
#include <gtest/gtest.h>
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

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (!treeduce::test_support::init_test_eal(argv[0], "tddpdkport", {"net_null0", "net_ring0"}))
    return 1;
  const int rc = RUN_ALL_TESTS();
  rte_eal_cleanup();
  return rc;
}
