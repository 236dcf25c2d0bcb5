// RequestQueue (request_queue.h): operations in start order, on the progress thread or, for a
// blocking call with nothing ahead of it, on the caller's.
#include "request_queue.h"

#include <optional>

namespace treeduce::host {

namespace {
const char kDestroyed[] = "The communicator was destroyed before the operation ran.";
}

RequestQueue::RequestQueue(Runner run, bool caller_runs)
    : run_(std::move(run)), caller_runs_(caller_runs), progress_([this] { progress(); }) {}

RequestQueue::~RequestQueue() { stop(); }

void RequestQueue::stop() {
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  if (progress_.joinable()) progress_.join();
}

Request RequestQueue::start(const Operation& o) {
  std::lock_guard lk(mu_);
  const Request id = next_request_++;
  Pending& p = pending_[id];
  p.op = o;
  if (o.count == 0) {
    p.done = true;  // nothing to reduce, on any rank: no packet, no rendezvous
  } else if (stopping_) {
    p.done = true;
    p.status = treeduce::Status(Code::cancelled, kDestroyed);
  } else {
    queue_.push_back(&p);
    work_cv_.notify_one();
  }
  return id;
}

treeduce::Status RequestQueue::run(const Operation& o) {
  if (o.count == 0) return treeduce::Status::Ok();
  {
    std::unique_lock lk(mu_);
    if (caller_runs_ && !stopping_ && !busy_ && queue_.empty()) {
      // Nothing ahead of it: run it here. Operations started meanwhile queue behind it, and the
      // progress thread waits for busy_ to clear before it takes them.
      busy_ = true;
      lk.unlock();
      treeduce::Status s = run_(o);
      lk.lock();
      busy_ = false;
      if (!queue_.empty()) work_cv_.notify_one();
      return s;
    }
  }
  const Request id = start(o);
  return *complete(id, true);
}

std::optional<treeduce::Status> RequestQueue::complete(Request req, bool block) {
  std::unique_lock lk(mu_);
  const auto it = pending_.find(req);
  if (it == pending_.end() || it->second.claimed) {
    return invalid_argument(
        "Request " + std::to_string(req) +
        (it == pending_.end() ? " is not pending (it was never started, or has completed already)."
                              : " is being waited for by another thread."));
  }
  // The element, not the iterator: pending_ may rehash while we wait (another thread starts an
  // operation), which invalidates iterators but not references.
  Pending& p = it->second;
  if (!p.done) {
    if (!block) return std::nullopt;
    p.claimed = true;
    done_cv_.wait(lk, [&] { return p.done; });
  }
  treeduce::Status s = std::move(p.status);
  pending_.erase(req);
  return s;
}

void RequestQueue::progress() {
  std::unique_lock lk(mu_);
  for (;;) {
    work_cv_.wait(lk, [&] { return stopping_ || (!queue_.empty() && !busy_); });
    if (stopping_) {
      for (Pending* p : queue_) {
        p->status = treeduce::Status(Code::cancelled, kDestroyed);
        p->done = true;
      }
      queue_.clear();
      done_cv_.notify_all();
      return;
    }
    Pending* p = queue_.front();
    queue_.pop_front();
    busy_ = true;
    lk.unlock();
    treeduce::Status s = run_(p->op);
    lk.lock();
    busy_ = false;
    p->status = std::move(s);
    p->done = true;
    done_cv_.notify_all();
  }
}

}  // namespace treeduce::host
