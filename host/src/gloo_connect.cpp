// Rendezvous and stale keys. Gloo's connectFullMesh has every rank write one key (its addresses)
// and read every other rank's. The store is a gloo::rendezvous::FileStore in store_dir behind a
// PrefixStore, so concurrent jobs (and uses) sharing a directory never read each other's keys. A
// key left from an earlier run would be read as if it were fresh (its address is dead) and make
// the new run fail, so no run leaves keys behind: once every rank has connected, a barrier proves
// every rank has read every key, and then each rank deletes the files it wrote itself
// (FileStore::getAllKeyFilePaths lists exactly those). A rank whose rendezvous fails deletes its
// own files too. Only a rank killed during rendezvous can leave a key; the callers' sentences
// then name the directory to clear. Deleting only one's own files, never the directory, keeps one
// rank from erasing a key that a slower rank of the same run has not read yet.
#include "gloo_connect.h"

#include <gloo/barrier.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include <cstring>
#include <exception>
#include <filesystem>
#include <system_error>

namespace treeduce::host {
namespace {

void remove_own_keys(gloo::rendezvous::FileStore& store) {
  for (const std::string& p : store.getAllKeyFilePaths()) {
    std::error_code ec;  // best effort: a key that is already gone is fine
    std::filesystem::remove(p, ec);
  }
}

}  // namespace

std::shared_ptr<gloo::Context> connect_gloo(const GlooRendezvous& r, std::string* reason) {
  std::error_code ec;
  std::filesystem::create_directories(r.store_dir, ec);
  if (ec) {
    *reason = "cannot create the directory: " + ec.message();
    return nullptr;
  }
  std::unique_ptr<gloo::rendezvous::FileStore> files;
  try {
    files = std::make_unique<gloo::rendezvous::FileStore>(r.store_dir);
    gloo::rendezvous::PrefixStore store(r.prefix, *files);
    gloo::transport::tcp::attr attr;
    attr.hostname = r.bind_address;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(static_cast<int>(r.rank),
                                                           static_cast<int>(r.world_size));
    ctx->setTimeout(r.timeout);
    ctx->connectFullMesh(store, device);
    gloo::BarrierOptions b(ctx);
    b.setTimeout(r.timeout);
    gloo::barrier(b);
    remove_own_keys(*files);
    return ctx;
  } catch (const std::exception& e) {
    if (files) remove_own_keys(*files);
    *reason = e.what();
    return nullptr;
  }
}

gloo::AllreduceOptions::Func gloo_reduce(agg::AccumulateFn acc, std::size_t elem_size) {
  return [acc, elem_size](void* c, const void* a, const void* b, std::size_t n) {
    if (c == a) {
      acc(c, b, n);
    } else if (c == b) {
      acc(c, a, n);
    } else {
      std::memcpy(c, a, n * elem_size);
      acc(c, b, n);
    }
  };
}

gloo::AllreduceOptions::Func gloo_reduce_32(agg::AccumulateFn acc) { return gloo_reduce(acc, 4); }

}  // namespace treeduce::host
