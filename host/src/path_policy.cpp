// decide_path (path_policy.h): network, fallback or error, and the reason kept for each.
#include "path_policy.h"

namespace treeduce::host {

PathDecision decide_path(Path asked, const std::optional<Obstacle>& obstacle) {
  if (asked == Path::host) {
    return {Verdict::host, "host-side reduction was asked for (path = host)", {}};
  }
  if (!obstacle) return {Verdict::network, "", {}};
  const Obstacle& o = *obstacle;
  if (o.fatal || asked == Path::network) {
    const std::string sentence =
        capitalise(o.why) + (o.say_path && !o.fatal ? ", and the path is network." : ".");
    return {Verdict::fail, o.why, treeduce::Status(o.code, sentence)};
  }
  return {o.this_call_only ? Verdict::fall_back_once : Verdict::fall_back, o.why, {}};
}

}  // namespace treeduce::host
