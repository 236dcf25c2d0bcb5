// RequestQueue (request_queue.h): operations in start order, on the progress thread or, for a
// blocking call with nothing ahead of it, on the caller's; completed in order.
#include "request_queue.h"

#include <optional>
#include <vector>

namespace treeduce::host {

namespace {
const char kDestroyed[] = "The communicator was destroyed before the operation ran.";
}

// The progress thread's feed: the queue's operations, taken under the lock.
class RequestQueue::QueueFeed final : public Feed {
 public:
  explicit QueueFeed(RequestQueue& q) : q_(q) {}
  const Operation* peek() override {
    std::lock_guard lk(q_.mu_);
    if (q_.stopping_ || q_.queue_.empty()) return nullptr;
    return &q_.queue_.front()->op;
  }
  void take() override {
    std::lock_guard lk(q_.mu_);
    taken_.push_back(q_.queue_.front());
    q_.queue_.pop_front();
  }
  void complete(treeduce::Status s) override {
    std::lock_guard lk(q_.mu_);
    Pending* p = taken_[done_++];
    p->status = std::move(s);
    p->done = true;
    q_.done_cv_.notify_all();
  }
  bool all_done() const { return done_ == taken_.size(); }

 private:
  RequestQueue& q_;
  std::vector<Pending*> taken_;  // in order; [done_, end) are running
  std::size_t done_ = 0;
};

// A blocking call's feed on the caller's thread: its one operation.
class RequestQueue::SingleFeed final : public Feed {
 public:
  explicit SingleFeed(const Operation& o) : op_(o) {}
  const Operation* peek() override { return taken_ ? nullptr : &op_; }
  void take() override { taken_ = true; }
  void complete(treeduce::Status s) override { status_ = std::move(s); }
  treeduce::Status status() { return std::move(status_); }

 private:
  const Operation& op_;
  bool taken_ = false;
  treeduce::Status status_;
};

RequestQueue::RequestQueue(Runner run, bool caller_runs, std::function<void()> kick)
    : run_(std::move(run)),
      caller_runs_(caller_runs),
      kick_(std::move(kick)),
      progress_([this] { progress(); }) {}

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
  std::unique_lock lk(mu_);
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
    if (busy_ && kick_) {
      lk.unlock();
      kick_();
    }
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
      SingleFeed feed(o);
      run_(feed);
      treeduce::Status s = feed.status();
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
    busy_ = true;
    lk.unlock();
    QueueFeed feed(*this);
    run_(feed);
    lk.lock();
    busy_ = false;
    if (!feed.all_done()) std::abort();  // a runner that leaves a request pending: a bug
  }
}

}  // namespace treeduce::host
