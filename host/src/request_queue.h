// The request queue: every operation of a communicator starts in the order it was started and
// completes in that order, so that every rank runs the same sequence on whichever path each one
// takes. The runner takes operations off the queue through a Feed: one at a time, or several
// (the network path streams queued operations back to back through its window), completing
// them in order. Non-blocking operations run on the queue's progress thread; a blocking one
// runs on the caller's thread when nothing is queued or running (no hand-off to the progress
// thread and back), and otherwise waits its turn in the queue like a non-blocking one. Any
// thread may start, test and wait for any request (docs/host.md, "Threads").
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "errors.h"

namespace treeduce::host {

/// One allreduce, as started.
struct Operation {
  const void* send = nullptr;
  void* recv = nullptr;
  std::size_t count = 0;
  DType dtype = DType::f32;
  ReduceOp op = ReduceOp::sum;
};

/// What a runner sees of the queue: the operations to run, in start order, and their completion.
class Feed {
 public:
  virtual ~Feed() = default;
  /// The next operation, without taking it (nullptr: none queued now). Never blocks.
  virtual const Operation* peek() = 0;
  /// Takes the operation peek() returned: the runner must complete it.
  virtual void take() = 0;
  /// Completes the oldest operation taken and not completed.
  virtual void complete(treeduce::Status s) = 0;
};

class RequestQueue {
 public:
  /// Runs the operations it takes from the feed (at least the first, which peek() shows) and
  /// completes every one it took, in order, before it returns (never throws). Called on one
  /// thread at a time.
  using Runner = std::function<void(Feed&)>;
  /// `caller_runs`: a blocking operation with nothing ahead of it runs on the caller's thread.
  /// `kick`: called (with no lock held) when an operation is queued while the runner runs, so
  /// that a runner waiting for the network can take it at once.
  RequestQueue(Runner run, bool caller_runs, std::function<void()> kick = {});
  ~RequestQueue();  ///< stop()

  /// Queues `o` and returns its request (an operation of no elements is done at once).
  Request start(const Operation& o);
  /// Runs `o` and returns its outcome, after every operation started before it.
  treeduce::Status run(const Operation& o);

  /// The outcome of a request that is done (the request is then gone), or nullopt when it is
  /// still running and `block` is false. An unknown request, or one another thread waits for,
  /// is invalid_argument.
  std::optional<treeduce::Status> complete(Request req, bool block);

  /// Fails what is queued ("The communicator was destroyed before the operation ran.") and
  /// ends the progress thread after the operation it runs. The caller makes that operation
  /// return first.
  void stop();

 private:
  struct Pending {
    Operation op;
    bool done = false;
    bool claimed = false;  // a thread is blocked in complete() on it: nobody else may take it
    treeduce::Status status;
  };

  class QueueFeed;
  class SingleFeed;
  void progress();

  const Runner run_;
  const bool caller_runs_;
  const std::function<void()> kick_;
  std::mutex mu_;
  std::condition_variable work_cv_;  // the progress thread: an operation queued, the runner
                                     // free again, or stopping
  std::condition_variable done_cv_;  // waiters: an operation completed
  std::deque<Pending*> queue_;
  std::unordered_map<Request, Pending> pending_;  // node-based: addresses stay valid in queue_
  Request next_request_ = 1;
  bool busy_ = false;  // an operation is running (on the progress thread or a caller's)
  bool stopping_ = false;
  std::thread progress_;
};

}  // namespace treeduce::host
