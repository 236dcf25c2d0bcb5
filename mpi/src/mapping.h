// MPI's predefined datatypes and operations to treeduce's (docs/mpi.md, "What is offloaded").
// Pure lookups on MPI handles: the unit test runs them without starting MPI.
#ifndef TREEDUCE_MPI_MAPPING_H
#define TREEDUCE_MPI_MAPPING_H

#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

#include <optional>
#include <string>

#include "treeduce/treeduce.h"

namespace treeduce::mpi {

/** The treeduce type an MPI datatype's elements reduce as; nullopt when it has none. */
std::optional<tdr_dtype_t> map_dtype(MPI_Datatype t);

/** The treeduce operation of a predefined MPI operation; nullopt for any other. */
std::optional<tdr_op_t> map_op(MPI_Op op);

/**
 * Bytes of one element of a predefined contiguous datatype (MPI_Bcast moves such a buffer as it
 * lies); 0 for a derived or non-contiguous datatype, which MPI_Bcast packs and unpacks.
 */
std::size_t bcast_element_bytes(MPI_Datatype t);

/**
 * Why MPI does not define `o` on `d` ("band (bitwise and) is defined on integer types only, ..."),
 * or nullopt for a reduction MPI defines: such a call passes through, and MPI reports its error.
 */
std::optional<std::string> undefined_pair(tdr_dtype_t d, tdr_op_t o);

/** MPI's name of a datatype or operation, for the counters' reasons ("MPI_DOUBLE", "MPI_SUM"). */
std::string dtype_name(MPI_Datatype t);
std::string op_name(MPI_Op op);

/** treeduce's name of a type or operation ("f64", "sum"), for the reasons. */
const char* tdr_dtype_name(tdr_dtype_t d);
const char* tdr_op_name(tdr_op_t o);

}  // namespace treeduce::mpi

#endif
