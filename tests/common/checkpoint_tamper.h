// Damage to checkpoint files, for the tests that prove the loader notices it (unit tests, the
// oases_tamper_checkpoint helper of the e2e tests, the fuzz corpus). Works on the bytes of a
// version 2 file (executor/checkpoint.h): magic, uint64 header length L, CRC-32C of the length and
// header, header JSON, data.
#pragma once

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include <boost/crc.hpp>

namespace oases::testutil {

struct CheckpointBytes {
  std::string magic;
  std::string header;
  std::string data;
  uint32_t header_crc = 0;

  static CheckpointBytes parse(const std::string& file) {
    if (file.size() < 20) throw std::runtime_error("not a version 2 checkpoint");
    CheckpointBytes c;
    c.magic = file.substr(0, 8);
    uint64_t hl = 0;
    std::memcpy(&hl, file.data() + 8, 8);
    std::memcpy(&c.header_crc, file.data() + 16, 4);
    c.header = file.substr(20, hl);
    c.data = file.substr(20 + hl);
    return c;
  }
  // Offset in the file of the header's first byte and of the data's first byte.
  static constexpr size_t kHeaderStart = 20;
  size_t data_start() const { return kHeaderStart + header.size(); }

  // The header's checksum made to match the (edited) header: damage that only the field checks
  // and the tensors' own checksums can catch.
  void reseal() {
    boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true> crc;
    uint64_t hl = header.size();
    crc.process_bytes(&hl, 8);
    crc.process_bytes(header.data(), header.size());
    header_crc = crc.checksum();
  }
  std::string bytes() const {
    uint64_t hl = header.size();
    std::string out = magic;
    out.append(reinterpret_cast<const char*>(&hl), 8);
    out.append(reinterpret_cast<const char*>(&header_crc), 4);
    return out + header + data;
  }
  // The old layout: no header checksum, version 1 (tensor checksums left in the table are ignored).
  std::string bytes_v1() const {
    std::string h = header;
    size_t at = h.find("\"version\":2");
    if (at == std::string::npos) throw std::runtime_error("no version field");
    h.replace(at, 11, "\"version\":1");
    uint64_t hl = h.size();
    std::string out = "OASESCK1";
    out.append(reinterpret_cast<const char*>(&hl), 8);
    return out + h + data;
  }
};

// Replaces the first `from` in `s` (which must be there).
inline void replace_once(std::string& s, const std::string& from, const std::string& to) {
  size_t at = s.find(from);
  if (at == std::string::npos) throw std::runtime_error("'" + from + "' not found in the checkpoint header");
  s.replace(at, from.size(), to);
}

}  // namespace oases::testutil
