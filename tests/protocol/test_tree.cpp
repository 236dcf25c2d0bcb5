// The one tree-validation function: every rule, its field and its sentence.
#include <gtest/gtest.h>

#include "test_util.h"
#include "treeduce/protocol/tree.h"

namespace treeduce::proto {
namespace {

using treeduce::dp::testing::tree_cfg;

TEST(Tree, AValidTreePasses) {
  EXPECT_FALSE(validate_tree(tree_cfg(2, true)).has_value());
  EXPECT_FALSE(validate_tree(tree_cfg(64, false, true, 4096, 8192)).has_value());
  EXPECT_FALSE(check_slots(1).has_value());
  EXPECT_FALSE(check_payload_bytes(256).has_value());
}

TEST(Tree, EachRuleNamesItsFieldAndSaysWhy) {
  struct Case {
    void (*mutate)(TreeConfig&);
    TreeField field;
    std::size_t child;
    const char* sentence;
  };
  const Case cases[] = {
      {[](TreeConfig& t) { t.children.clear(); }, TreeField::children, 0,
       "the number of children must be from 1 to 64, got 0."},
      {[](TreeConfig& t) { t.children.resize(65, t.children[0]); }, TreeField::children, 0,
       "the number of children must be from 1 to 64, got 65."},
      {[](TreeConfig& t) { t.children[1].addr.ip = 0; }, TreeField::child_address, 1,
       "child 0.0.0.0:50000 needs an address other than 0.0.0.0 and a port from 1 to 65535."},
      {[](TreeConfig& t) { t.children[1].addr = t.children[0].addr; }, TreeField::child_address, 1,
       "child 10.0.0.100:50000 is listed twice."},
      {[](TreeConfig& t) { t.children[0].hosts = 0; }, TreeField::child_hosts, 0,
       "child 10.0.0.100:50000: hosts must be from 1 to 65535, got 0."},
      {[](TreeConfig& t) { t.children[0].hosts = t.children[1].hosts = 40000; },
       TreeField::children, 0, "the children have 80000 hosts in all, more than 65535."},
      {[](TreeConfig& t) { t.slots = 12; }, TreeField::slots, 0,
       "slots must be a power of two from 1 to 4096, got 12."},
      {[](TreeConfig& t) { t.slots = 0; }, TreeField::slots, 0,
       "slots must be a power of two from 1 to 4096, got 0."},
      {[](TreeConfig& t) { t.payload_bytes = 16384; }, TreeField::payload_bytes, 0,
       "payload_bytes must be a power of two from 256 to 8192, got 16384."},
      {[](TreeConfig& t) { t.dtype_mask = 0; }, TreeField::dtype_mask, 0,
       "dtypes must name at least one type."},
      {[](TreeConfig& t) { t.dtype_mask = 1u << 17; }, TreeField::dtype_mask, 0,
       "dtypes must name at least one type."},
      {[](TreeConfig& t) { t.dtype_mask = 1u << 17 | 1u; }, TreeField::dtype_mask, 0,
       "dtypes names a type with code 17; the codes are 0 to 16."},
      {[](TreeConfig& t) { t.dtype_mask = 1u << 31 | 1u << 16; }, TreeField::dtype_mask, 0,
       "dtypes names a type with code 31; the codes are 0 to 16."},
      {[](TreeConfig& t) { t.op_mask = 1u << 12; }, TreeField::op_mask, 0,
       "ops must name at least one operation."},
      {[](TreeConfig& t) { t.op_mask = 1u << 12 | 1u << 11; }, TreeField::op_mask, 0,
       "ops names an operation with code 12; the codes are 0 to 11."},
      {[](TreeConfig& t) { t.role = static_cast<Role>(3); }, TreeField::role, 0,
       "the role must be leaf, inner or root."},
      {[](TreeConfig& t) { t.role = Role::root; }, TreeField::parent, 0,
       "a root has no parent, but parent is set."},
      {[](TreeConfig& t) { t.parent = {}; }, TreeField::parent, 0,
       "role leaf needs a parent (parent: A.B.C.D:PORT)."},
      {[](TreeConfig& t) { t.index_at_parent = 64; }, TreeField::index_at_parent, 0,
       "index_at_parent must be from 0 to 63, got 64."},
  };
  for (const Case& c : cases) {
    TreeConfig t = tree_cfg(2, false);
    c.mutate(t);
    const auto issue = validate_tree(t);
    ASSERT_TRUE(issue.has_value()) << c.sentence;
    EXPECT_EQ(issue->field, c.field) << c.sentence;
    EXPECT_EQ(issue->child, c.child) << c.sentence;
    EXPECT_EQ(issue->sentence, c.sentence);
  }
}

// libtreeduce's window when none is asked: 64 KiB of payload in flight, 32 to 64 slots, every
// result one a switch takes.
TEST(Tree, DefaultWindowHoldsSixtyFourKiBOfPayload) {
  EXPECT_EQ(default_window(256), 64u);
  EXPECT_EQ(default_window(512), 64u);
  EXPECT_EQ(default_window(1024), 64u);
  EXPECT_EQ(default_window(2048), 32u);
  EXPECT_EQ(default_window(4096), 32u);
  EXPECT_EQ(default_window(8192), 32u);
  EXPECT_EQ(default_window(0), 64u);
  for (std::uint32_t p = 256; p <= 8192; p *= 2) EXPECT_FALSE(check_slots(default_window(p)));
}

TEST(Tree, RoleNames) {
  EXPECT_EQ(name(Role::leaf), "leaf");
  EXPECT_EQ(name(Role::inner), "inner");
  EXPECT_EQ(name(Role::root), "root");
  EXPECT_EQ(name(static_cast<Role>(9)), "?");
}

}  // namespace
}  // namespace treeduce::proto
